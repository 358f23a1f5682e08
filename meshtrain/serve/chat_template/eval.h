#pragma once
// Internal to the chat template interpreter: the tree-walking evaluator. One Interp per render
// (the syntax tree is shared and read-only). Statements and expressions live in
// eval.cpp; attribute/item access, methods, tests and globals in
// methods.cpp; filters in filters.cpp.
#include <string>
#include <unordered_map>
#include <vector>

#include "meshtrain/serve/chat_template/ast.h"

namespace mt::serve::chat_template_detail {

class Interp {
 public:
  using Scope = std::unordered_map<std::string, Value>;
  enum class Flow { Normal, Break, Continue };

  Interp(const ProgramTree& tree, const Value& variables);
  std::string render();

  // --- statements and expressions (eval.cpp) ---
  Flow exec_body(const Body& body, std::string& out);
  Flow exec(const Node& node, std::string& out);
  Value eval(const Expr& e);  // RuntimeFail inside becomes mt::Error naming e's position
  Value lookup(const std::string& name) const;
  void assign(const Target& target, const Value& value);
  Value call(const Value& callee, const CallArgs& args);
  Value call_macro(const Node& macro, const CallArgs& args);
  Value binary_op(const std::string& op, const Value& a, const Value& b);
  bool contains(const Value& container, const Value& item);

  // --- access, methods, tests, globals (methods.cpp) ---
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);
  Value slice(const Value& obj, const std::optional<int64_t>& start, const std::optional<int64_t>& stop,
              const std::optional<int64_t>& step);
  bool apply_test(const std::string& name, const Value& subject, const CallArgs& args);
  void install_globals();

  // --- filters (filters.cpp) ---
  Value apply_filter(const std::string& name, const Value& subject, const CallArgs& args);

 private:
  Value eval_inner(const Expr& e);
  Value eval_filter_chain(const Expr& filter, const Value& subject);
  CallArgs eval_args(const Expr& e);
  Flow exec_for(const Node& node, std::string& out);

  const ProgramTree& tree_;
  std::vector<Scope> scopes_;  // [0]: the render's variables and top-level sets
  Scope globals_;
  int macro_depth_ = 0;
};

// Arguments of builtins (filters, tests, methods, globals): by position or keyword.
const Value& required_arg(const CallArgs& args, size_t index, const char* name, const char* function);
std::optional<std::string> string_arg(const CallArgs& args, size_t index, const char* name);  // None: absent
int64_t int_arg(const CallArgs& args, size_t index, const char* name, int64_t fallback);
bool bool_arg(const CallArgs& args, size_t index, const char* name, bool fallback);

// Python's `fmt % args` for the conversions templates use (%s %r %d %i %f %x %%).
std::string percent_format(const std::string& fmt, const Value& args);
// Python's int()/float() of a value (for |int, |float, %d); nullopt when Python would raise.
std::optional<int64_t> to_int(const Value& v);
std::optional<double> to_float(const Value& v);

}  // namespace mt::serve::chat_template_detail
