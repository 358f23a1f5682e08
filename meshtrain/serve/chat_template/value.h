#pragma once
// Internal to the chat template interpreter (chat_template.h): the values templates compute
// with, modelled on Python's (the types Jinja2 sees when transformers renders a template), and
// the Python semantics they need: truth, equality, ordering, str() and repr(), json.dumps.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::serve::chat_template_detail {

class Interp;
struct Value;

// A runtime failure of the template (a Python TypeError, an UndefinedError, ...); the evaluator
// turns it into mt::Error naming the template line and column of the expression that failed.
struct RuntimeFail : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Namespace, Callable };

using List = std::vector<Value>;

// A Python dict: insertion-ordered, keys compared with Python equality (1 == 1.0 == True).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  void set(Value key, Value value);
};

// jinja2's namespace(): the one mutable object templates have (`{% set ns.x = ... %}`).
struct Namespace {
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument at `index` or named `name`, when given.
  const Value* get(size_t index, const std::string& name) const;
  // The keyword argument `name` (arguments that cannot be given by position).
  const Value* keyword_only(const std::string& name) const { return get(positional.size(), name); }
};

// Globals, bound methods (`s.strip`), macros and loop.cycle.
struct Callable {
  std::string name;
  std::function<Value(Interp&, const CallArgs&)> fn;
};

struct Value {
  Kind kind = Kind::Undefined;
  bool markup = false;  // a String that is markupsafe.Markup (escape, safe)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String: the text (UTF-8); Undefined: what was missing, for the error
  std::shared_ptr<const List> list;  // List, Tuple
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Namespace> ns;
  std::shared_ptr<const Callable> fn;

  static Value undefined(std::string why = "value is undefined") {
    Value v;
    v.s = std::move(why);
    return v;
  }
  static Value none() { return make(Kind::None); }
  static Value boolean(bool x) {
    Value v = make(Kind::Bool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(Kind::Int);
    v.i = x;
    return v;
  }
  static Value floating(double x) {
    Value v = make(Kind::Float);
    v.f = x;
    return v;
  }
  static Value string(std::string x, bool is_markup = false) {
    Value v = make(Kind::String);
    v.s = std::move(x);
    v.markup = is_markup;
    return v;
  }
  static Value list_of(List items) {
    Value v = make(Kind::List);
    v.list = std::make_shared<const List>(std::move(items));
    return v;
  }
  static Value tuple_of(List items) {
    Value v = make(Kind::Tuple);
    v.list = std::make_shared<const List>(std::move(items));
    return v;
  }
  static Value dict_of(Dict d) {
    Value v = make(Kind::Dict);
    v.dict = std::make_shared<const Dict>(std::move(d));
    return v;
  }
  static Value callable(std::string name, std::function<Value(Interp&, const CallArgs&)> fn) {
    Value v = make(Kind::Callable);
    v.fn = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
    return v;
  }
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Bool || kind == Kind::Int || kind == Kind::Float; }
  bool is_integral() const { return kind == Kind::Bool || kind == Kind::Int; }  // Python int (bool included)
  bool is_sequence() const { return kind == Kind::List || kind == Kind::Tuple; }
  int64_t as_int() const { return kind == Kind::Bool ? (b ? 1 : 0) : i; }
  double as_double() const { return kind == Kind::Float ? f : static_cast<double>(as_int()); }
};

// The JSON variables of a render as Python values (objects keep nlohmann's key order).
Value from_json(const nlohmann::json& j);

// Python's type name ("str", "int", "list", "dict", "NoneType", "Undefined", ...).
std::string type_name(const Value& v);
// Throws RuntimeFail (Python's TypeError) for values that cannot be dict keys or set members.
void check_hashable(const Value& v);
// Throws RuntimeFail with the undefined value's message (jinja2's UndefinedError).
[[noreturn]] void fail_undefined(const Value& v);

bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// Python's ordering: <0, 0, >0; throws RuntimeFail for types Python cannot order (`op` names
// the operator in the message).
int compare(const Value& a, const Value& b, const char* op = "<");

std::string to_str(const Value& v);   // Python str()
std::string to_repr(const Value& v);  // Python repr()
std::string float_repr(double x);
std::string string_repr(const std::string& s);

// Python's json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...).
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // the indentation of one level, when indenting
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const JsonOptions& options);

// markupsafe.escape of a str: & < > ' " as entities.
std::string html_escape(const std::string& s);

// Elements of an iterable as Python iterates it: sequences, dict keys, a string's characters,
// nothing for Undefined; throws RuntimeFail for the rest.
List iterate(const Value& v);

// --- UTF-8 text with Python's str semantics (text.cpp) -------------------------
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
void utf8_append(std::string& out, char32_t cp);
size_t utf8_length(const std::string& s);
bool py_isspace(char32_t c);
bool py_isprintable(char32_t c);
bool py_is_linebreak(char32_t c);  // what str.splitlines splits at
char32_t cp_upper(char32_t c);
char32_t cp_lower(char32_t c);
char32_t cp_title(char32_t c);
bool cp_is_cased(char32_t c);
bool cp_is_alnum(char32_t c);
bool cp_is_alpha(char32_t c);
bool cp_is_digit(char32_t c);
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_title(const std::string& s);       // str.title()
std::string py_capitalize(const std::string& s);  // str.capitalize()
// str.strip / lstrip / rstrip: `chars` absent strips whitespace.
std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right);
std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> py_splitlines(const std::string& s, bool keepends);
std::string py_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count);
// Python slice of a sequence of `length` items: the indices it selects.
std::vector<int64_t> slice_indices(int64_t length, const std::optional<int64_t>& start,
                                   const std::optional<int64_t>& stop, const std::optional<int64_t>& step);

}  // namespace mt::serve::chat_template_detail
