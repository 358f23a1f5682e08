#pragma once
// Internal to the chat template interpreter: the recursive-descent parser over the lexer's
// tokens, with jinja2's grammar and precedences. Statements live in parser.cpp,
// expressions in parse_expr.cpp.
#include <string>
#include <vector>

#include "meshtrain/serve/chat_template/ast.h"

namespace mt::serve::chat_template_detail {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  ProgramTree parse();

  // --- token stream ---
  const Token& cur() const { return tokens_[index_]; }
  const Token& look(size_t ahead) const {
    const size_t k = index_ + ahead;
    return tokens_[k < tokens_.size() ? k : tokens_.size() - 1];
  }
  void next() {
    if (index_ + 1 < tokens_.size()) ++index_;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == Tok::Name && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const char* op);
  std::string expect_name();
  void expect_block_end();
  static std::string describe(const Token& t);
  [[noreturn]] void fail(const Token& at, const std::string& message) const;

  // --- statements (parser.cpp) ---
  // Parses nodes until one of `end_tags` opens a block tag (left current: that tag's name
  // token, which the caller consumes); at the end of the template when end_tags is empty.
  Body subparse(const std::vector<std::string>& end_tags, const std::string& block, const Pos& opened);
  NodePtr parse_statement();
  NodePtr parse_if(const Pos& pos);
  NodePtr parse_for(const Pos& pos);
  NodePtr parse_set(const Pos& pos);
  NodePtr parse_macro(const Pos& pos);
  NodePtr parse_filter_block(const Pos& pos);
  NodePtr parse_with(const Pos& pos);
  Target parse_target(bool with_namespace, const char* end_name);

  // --- expressions (parse_expr.cpp) ---
  ExprPtr parse_expression(bool with_condexpr = true);
  ExprPtr parse_tuple(bool with_condexpr = true, const char* extra_end = nullptr, bool explicit_parentheses = false);
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  ExprPtr parse_call(ExprPtr node);
  // `|name(args)` chains; start_inline: the first filter has no leading '|' ({% filter %}).
  ExprPtr parse_filter(ExprPtr node, bool start_inline = false);
  ExprPtr parse_test(ExprPtr node);
  void parse_call_args(Expr& into);

  int loop_depth = 0;

 private:
  const std::vector<Token>& tokens_;
  size_t index_ = 0;
};

ExprPtr make_expr(ExprKind kind, const Pos& pos);

}  // namespace mt::serve::chat_template_detail
