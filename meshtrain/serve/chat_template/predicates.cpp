// The Jinja tests (`x is defined`, `x is not none`, `n is divisibleby 3`, ...) of the chat
// template interpreter, with jinja2's definitions (bool counts as a number but not an integer;
// Undefined is iterable; `sequence` needs len() and indexing).
#include "meshtrain/serve/chat_template/eval.h"

namespace mt::serve::chat_template_detail {

namespace {

const char* const kTests[] = {"defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number",
                              "string", "mapping", "iterable", "sequence", "callable", "odd", "even", "divisibleby",
                              "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt",
                              "greaterthan", ">", "ge", ">=", "in", "lower", "upper", "sameas", "escaped", "filter",
                              "test"};

bool islower_or_upper(const std::string& s, bool upper) {
  bool cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (!cp_is_cased(c)) continue;
    const bool is_upper = cp_lower(c) != c && cp_upper(c) == c;
    const bool is_lower = cp_upper(c) != c && cp_lower(c) == c;
    if (upper ? is_upper : is_lower) cased = true;
    else if (is_upper || is_lower) return false;
  }
  return cased;
}

}  // namespace

bool has_test(const std::string& name) {
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

bool Interp::apply_test(const std::string& name, const Value& v, const CallArgs& args) {
  const Kind k = v.kind;
  if (name == "defined") return k != Kind::Undefined;
  if (name == "undefined") return k == Kind::Undefined;
  if (name == "none") return k == Kind::None;
  if (name == "boolean") return k == Kind::Bool;
  if (name == "true") return k == Kind::Bool && v.b;
  if (name == "false") return k == Kind::Bool && !v.b;
  if (name == "integer") return k == Kind::Int;
  if (name == "float") return k == Kind::Float;
  if (name == "number") return v.is_number();
  if (name == "string") return k == Kind::String;
  if (name == "mapping") return k == Kind::Dict;
  if (name == "iterable")
    return k == Kind::Undefined || k == Kind::String || k == Kind::List || k == Kind::Tuple || k == Kind::Dict;
  if (name == "sequence")  // jinja2 3.1 counts Undefined as a sequence too
    return k == Kind::Undefined || k == Kind::String || k == Kind::List || k == Kind::Tuple || k == Kind::Dict;
  if (name == "callable") return k == Kind::Callable || k == Kind::Undefined;
  if (name == "escaped") return k == Kind::String && v.markup;
  if (name == "odd" || name == "even") {
    const Value r = binary_op("%", v, Value::integer(2));
    return equals(r, Value::integer(name == "odd" ? 1 : 0));
  }
  if (name == "divisibleby")
    return equals(binary_op("%", v, required_arg(args, 0, "num", "divisibleby")), Value::integer(0));
  if (name == "lower" || name == "upper") return islower_or_upper(to_str(v), name == "upper");
  if (name == "filter" || name == "test")  // `'upper' is filter`: is there a filter of that name
    return k == Kind::String && (name == "filter" ? has_filter(v.s) : has_test(v.s));
  const Value& other = required_arg(args, 0, "other", name.c_str());
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, other);
  if (name == "ne" || name == "!=") return !equals(v, other);
  if (name == "in") return contains(other, v);
  if (name == "sameas") {
    if (v.kind != other.kind) return false;
    switch (k) {
      case Kind::None:
      case Kind::Undefined: return true;
      case Kind::Bool: return v.b == other.b;
      case Kind::Int: return v.i == other.i && v.i >= -5 && v.i <= 256;  // CPython's small int cache
      case Kind::List:
      case Kind::Tuple: return v.list == other.list;
      case Kind::Dict: return v.dict == other.dict;
      case Kind::Namespace: return v.ns == other.ns;
      case Kind::Callable: return v.fn == other.fn;
      default: return false;
    }
  }
  const int c = compare(v, other, name.c_str());
  if (name == "lt" || name == "lessthan" || name == "<") return c < 0;
  if (name == "le" || name == "<=") return c <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return c > 0;
  return c >= 0;  // ge, >=
}

}  // namespace mt::serve::chat_template_detail
