// Attribute and item access as jinja2's sandbox does it (methods first for str/dict/list, then
// items; missing things are Undefined), the str/dict/list methods templates call, the tests
// (`is ...`) and the globals (range, dict, namespace, joiner, raise_exception, strftime_now).
#include <ctime>

#include "meshtrain/core/error.h"
#include "meshtrain/serve/chat_template/eval.h"

namespace mt::serve::chat_template_detail {

const Value& required_arg(const CallArgs& args, size_t index, const char* name, const char* function) {
  const Value* v = args.get(index, name);
  if (!v) throw RuntimeFail(std::string("TypeError: ") + function + "() missing required argument '" + name + "'");
  return *v;
}

std::optional<std::string> string_arg(const CallArgs& args, size_t index, const char* name) {
  const Value* v = args.get(index, name);
  if (!v || v->kind == Kind::None) return std::nullopt;
  if (v->is_undefined()) fail_undefined(*v);
  if (v->kind != Kind::String) throw RuntimeFail(std::string("TypeError: argument '") + name + "' must be str, not " + type_name(*v));
  return v->s;
}

int64_t int_arg(const CallArgs& args, size_t index, const char* name, int64_t fallback) {
  const Value* v = args.get(index, name);
  if (!v || v->kind == Kind::None) return fallback;
  if (!v->is_integral()) throw RuntimeFail(std::string("TypeError: argument '") + name + "' must be an integer, not " + type_name(*v));
  return v->as_int();
}

bool bool_arg(const CallArgs& args, size_t index, const char* name, bool fallback) {
  const Value* v = args.get(index, name);
  return v ? truthy(*v) : fallback;
}

namespace {

bool is_str_method(const std::string& n) {
  static const char* const kNames[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "rsplit",
                                       "splitlines", "upper", "lower", "title", "capitalize", "replace", "find",
                                       "rfind", "count", "join", "format", "isdigit", "isalpha", "isalnum", "isspace",
                                       "isupper", "islower", "removeprefix", "removesuffix", "casefold", "swapcase"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

Value string_list(const std::vector<std::string>& parts) {
  List out;
  for (const auto& p : parts) out.push_back(Value::string(p));
  return Value::list_of(std::move(out));
}

bool all_chars(const std::string& s, bool (*pred)(char32_t)) {
  const std::u32string t = utf8_decode(s);
  if (t.empty()) return false;
  for (char32_t c : t)
    if (!pred(c)) return false;
  return true;
}

// str.islower / str.isupper: some cased character and none of the other case.
bool case_is(const std::string& s, bool upper) {
  bool cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (!cp_is_cased(c)) continue;
    if (upper ? cp_lower(c) != c && cp_upper(c) == c : cp_upper(c) != c && cp_lower(c) == c) cased = true;
    else return false;
  }
  return cased;
}

bool matches_affix(const Value& obj, const Value& affix, bool prefix) {
  auto one = [&](const std::string& a) {
    if (a.size() > obj.s.size()) return false;
    return prefix ? obj.s.compare(0, a.size(), a) == 0 : obj.s.compare(obj.s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.kind == Kind::String) return one(affix.s);
  if (affix.kind == Kind::Tuple) {
    for (const Value& v : *affix.list)
      if (v.kind == Kind::String && one(v.s)) return true;
    return false;
  }
  throw RuntimeFail(std::string("TypeError: ") + (prefix ? "startswith" : "endswith") +
                    " first arg must be str or a tuple of str, not " + type_name(affix));
}

std::string str_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    const char c = fmt[k];
    if (c == '}' ) {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}') ++k;
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out.push_back('{');
      ++k;
      continue;
    }
    const size_t close = fmt.find('}', k);
    if (close == std::string::npos) throw RuntimeFail("ValueError: Single '{' encountered in format string");
    std::string field = fmt.substr(k + 1, close - k - 1);
    k = close;
    char conversion = 's';
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 's';
      field.resize(bang);
    }
    if (field.find(':') != std::string::npos) throw RuntimeFail("format specs in str.format are not supported");
    const Value* v = nullptr;
    if (field.empty()) {
      v = args.get(auto_index++, "");
    } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      v = args.get(static_cast<size_t>(std::stoul(field)), "");
    } else {
      for (const auto& [name, value] : args.keyword)
        if (name == field) v = &value;
      if (!v) throw RuntimeFail("KeyError: '" + field + "'");
    }
    if (!v) throw RuntimeFail("IndexError: Replacement index out of range for positional args tuple");
    out += conversion == 'r' ? to_repr(*v) : to_str(*v);
  }
  return out;
}

Value string_method(const Value& obj, const std::string& name, const CallArgs& a) {
  const std::string& s = obj.s;
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::string(py_strip(s, string_arg(a, 0, "chars"), name != "rstrip", name != "lstrip"), obj.markup);
  if (name == "startswith" || name == "endswith")
    return Value::boolean(matches_affix(obj, required_arg(a, 0, "prefix", name.c_str()), name == "startswith"));
  if (name == "split") return string_list(py_split(s, string_arg(a, 0, "sep"), int_arg(a, 1, "maxsplit", -1)));
  if (name == "rsplit") {
    const auto sep = string_arg(a, 0, "sep");
    const int64_t maxsplit = int_arg(a, 1, "maxsplit", -1);
    if (maxsplit < 0 || !sep) return string_list(py_split(s, sep, maxsplit));
    if (sep->empty()) throw RuntimeFail("ValueError: empty separator");
    std::vector<std::string> parts;
    size_t end = s.size();
    while (static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string::npos) break;
      parts.insert(parts.begin(), s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    parts.insert(parts.begin(), s.substr(0, end));
    return string_list(parts);
  }
  if (name == "splitlines") return string_list(py_splitlines(s, bool_arg(a, 0, "keepends", false)));
  if (name == "upper") return Value::string(py_upper(s), obj.markup);
  if (name == "lower" || name == "casefold") return Value::string(py_lower(s), obj.markup);
  if (name == "title") return Value::string(py_title(s), obj.markup);
  if (name == "capitalize") return Value::string(py_capitalize(s), obj.markup);
  if (name == "swapcase") {
    std::string out;
    for (char32_t c : utf8_decode(s)) utf8_append(out, cp_upper(c) != c ? cp_upper(c) : cp_lower(c));
    return Value::string(out, obj.markup);
  }
  if (name == "replace") {
    const Value& old = required_arg(a, 0, "old", "replace");
    const Value& with = required_arg(a, 1, "new", "replace");
    if (old.kind != Kind::String || with.kind != Kind::String) throw RuntimeFail("TypeError: replace() arguments must be str");
    return Value::string(py_replace(s, old.s, with.s, int_arg(a, 2, "count", -1)), obj.markup);
  }
  if (name == "find" || name == "rfind" || name == "count") {
    const Value& sub = required_arg(a, 0, "sub", name.c_str());
    if (sub.kind != Kind::String) throw RuntimeFail("TypeError: must be str, not " + type_name(sub));
    if (name == "count") {
      if (sub.s.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub.s); at != std::string::npos; at = s.find(sub.s, at + sub.s.size())) ++n;
      return Value::integer(n);
    }
    const size_t at = name == "find" ? s.find(sub.s) : s.rfind(sub.s);
    return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(utf8_length(s.substr(0, at))));
  }
  if (name == "join") {
    std::string out;
    const List items = iterate(required_arg(a, 0, "iterable", "join"));
    for (size_t k = 0; k < items.size(); ++k) {
      if (items[k].kind != Kind::String)
        throw RuntimeFail("TypeError: sequence item " + std::to_string(k) + ": expected str instance, " +
                          type_name(items[k]) + " found");
      out += (k ? s : "") + items[k].s;
    }
    return Value::string(out);
  }
  if (name == "format") return Value::string(str_format(s, a));
  if (name == "isdigit") return Value::boolean(all_chars(s, cp_is_digit));
  if (name == "isalpha") return Value::boolean(all_chars(s, cp_is_alpha));
  if (name == "isalnum") return Value::boolean(all_chars(s, cp_is_alnum));
  if (name == "isspace") return Value::boolean(all_chars(s, py_isspace));
  if (name == "isupper" || name == "islower") return Value::boolean(case_is(s, name == "isupper"));
  if (name == "removeprefix" || name == "removesuffix") {
    const Value& affix = required_arg(a, 0, "affix", name.c_str());
    if (affix.kind != Kind::String) throw RuntimeFail("TypeError: " + name + "() argument must be str");
    if (!matches_affix(obj, affix, name == "removeprefix")) return obj;
    return Value::string(name == "removeprefix" ? s.substr(affix.s.size()) : s.substr(0, s.size() - affix.s.size()), obj.markup);
  }
  throw RuntimeFail("AttributeError: 'str' object has no attribute '" + name + "'");
}

Value dict_method(const Value& obj, const std::string& name, const CallArgs& a) {
  const Dict& d = *obj.dict;
  List out;
  if (name == "keys" || name == "values" || name == "items") {
    for (const auto& [k, v] : d.items)
      out.push_back(name == "keys" ? k : name == "values" ? v : Value::tuple_of({k, v}));
    return Value::list_of(std::move(out));
  }
  if (name == "get") {
    check_hashable(required_arg(a, 0, "key", "get"));
    const Value* found = d.find(required_arg(a, 0, "key", "get"));
    if (found) return *found;
    const Value* fallback = a.get(1, "default");
    return fallback ? *fallback : Value::none();
  }
  if (name == "copy") return obj;
  throw RuntimeFail("AttributeError: 'dict' object has no attribute '" + name + "'");
}

Value list_method(const Value& obj, const std::string& name, const CallArgs& a) {
  const Value& x = required_arg(a, 0, "value", name.c_str());
  int64_t n = 0;
  for (size_t k = 0; k < obj.list->size(); ++k) {
    if (!equals((*obj.list)[k], x)) continue;
    if (name == "index") return Value::integer(static_cast<int64_t>(k));
    ++n;
  }
  if (name == "index") throw RuntimeFail("ValueError: " + to_repr(x) + " is not in list");
  return Value::integer(n);
}

Value bind(const Value& obj, const std::string& name, Value (*method)(const Value&, const std::string&, const CallArgs&)) {
  return Value::callable(name, [obj, name, method](Interp&, const CallArgs& a) { return method(obj, name, a); });
}

// "'int object'": how jinja2 names the object in its Undefined messages.
std::string object_label(const Value& obj) {
  std::string label = "'";
  label += type_name(obj);
  label += " object'";
  return label;
}

Value unsafe(const std::string& name, const Value& obj) {
  return Value::undefined("SecurityError: access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.");
}

}  // namespace

Value Interp::get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Kind::Undefined: fail_undefined(obj);
    case Kind::String:
      if (is_str_method(name)) return bind(obj, name, string_method);
      break;
    case Kind::Dict:
      if (name == "keys" || name == "values" || name == "items" || name == "get" || name == "copy")
        return bind(obj, name, dict_method);
      if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear")
        return unsafe(name, obj);
      if (const Value* v = obj.dict->find(name)) return *v;
      break;
    case Kind::List:
    case Kind::Tuple:
      if (name == "index" || name == "count") return bind(obj, name, list_method);
      if (obj.kind == Kind::List && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                                     name == "remove" || name == "reverse" || name == "sort" || name == "clear"))
        return unsafe(name, obj);
      break;
    case Kind::Namespace:
      if (const Value* v = obj.ns->find(name)) return *v;
      break;
    case Kind::Bool:
    case Kind::Int:
    case Kind::Float:  // the number attributes of Python's int and float
      if (name == "real") return obj.kind == Kind::Float ? obj : Value::integer(obj.as_int());
      if (name == "imag") return obj.kind == Kind::Float ? Value::floating(0.0) : Value::integer(0);
      if (obj.kind != Kind::Float && name == "numerator") return Value::integer(obj.as_int());
      if (obj.kind != Kind::Float && name == "denominator") return Value::integer(1);
      break;
    default:
      break;
  }
  return Value::undefined(object_label(obj) + " has no attribute '" + name + "'");
}

Value Interp::get_item(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Kind::Undefined: fail_undefined(obj);
    case Kind::List:
    case Kind::Tuple:
    case Kind::String:
      if (key.is_integral()) {
        const bool text = obj.kind == Kind::String;
        const std::u32string chars = text ? utf8_decode(obj.s) : std::u32string();
        const int64_t length = text ? static_cast<int64_t>(chars.size()) : static_cast<int64_t>(obj.list->size());
        int64_t k = key.as_int();
        if (k < 0) k += length;
        if (k < 0 || k >= length)
          return Value::undefined(object_label(obj) + " has no element " + std::to_string(key.as_int()));
        if (!text) return (*obj.list)[static_cast<size_t>(k)];
        std::string one;
        utf8_append(one, chars[static_cast<size_t>(k)]);
        return Value::string(one, obj.markup);
      }
      break;
    case Kind::Dict:
      if (const Value* v = obj.dict->find(key)) return *v;
      break;
    default:
      break;
  }
  if (key.kind == Kind::String) return get_attr(obj, key.s);
  return Value::undefined(object_label(obj) + " has no element " + to_repr(key));
}

Value Interp::slice(const Value& obj, const std::optional<int64_t>& start, const std::optional<int64_t>& stop,
                    const std::optional<int64_t>& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.kind == Kind::String) {
    const std::u32string chars = utf8_decode(obj.s);
    std::u32string out;
    for (int64_t k : slice_indices(static_cast<int64_t>(chars.size()), start, stop, step)) out.push_back(chars[static_cast<size_t>(k)]);
    return Value::string(utf8_encode(out), obj.markup);
  }
  if (obj.is_sequence()) {
    List out;
    for (int64_t k : slice_indices(static_cast<int64_t>(obj.list->size()), start, stop, step))
      out.push_back((*obj.list)[static_cast<size_t>(k)]);
    return obj.kind == Kind::Tuple ? Value::tuple_of(std::move(out)) : Value::list_of(std::move(out));
  }
  // jinja2 compiles slices to a plain Python subscript (no getitem fallback to Undefined)
  if (obj.kind == Kind::Dict) throw RuntimeFail("TypeError: unhashable type: 'slice'");
  throw RuntimeFail("TypeError: '" + type_name(obj) + "' object is not subscriptable");
}

void Interp::install_globals() {
  globals_["range"] = Value::callable("range", [](Interp&, const CallArgs& a) {
    if (a.positional.empty() || a.positional.size() > 3) throw RuntimeFail("TypeError: range expected 1 to 3 arguments");
    for (const Value& v : a.positional)
      if (!v.is_integral()) throw RuntimeFail("TypeError: '" + type_name(v) + "' object cannot be interpreted as an integer");
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) stop = a.positional[0].as_int();
    else start = a.positional[0].as_int(), stop = a.positional[1].as_int();
    if (a.positional.size() == 3) step = a.positional[2].as_int();
    if (step == 0) throw RuntimeFail("ValueError: range() arg 3 must not be zero");
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (out.size() >= 100000) throw RuntimeFail("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      out.push_back(Value::integer(k));
    }
    return Value::list_of(std::move(out));
  });
  globals_["dict"] = Value::callable("dict", [](Interp&, const CallArgs& a) {
    Dict d;
    if (!a.positional.empty()) {
      const Value& src = a.positional[0];
      if (src.kind == Kind::Dict) d = *src.dict;
      else
        for (const Value& pair : iterate(src)) {
          const List kv = iterate(pair);
          if (kv.size() != 2) throw RuntimeFail("ValueError: dictionary update sequence element has the wrong length");
          d.set(kv[0], kv[1]);
        }
    }
    for (const auto& [k, v] : a.keyword) d.set(Value::string(k), v);
    return Value::dict_of(std::move(d));
  });
  globals_["namespace"] = Value::callable("namespace", [](Interp&, const CallArgs& a) {
    Value v = Value::make(Kind::Namespace);
    v.ns = std::make_shared<Namespace>();
    for (const Value& src : a.positional) {
      if (src.kind != Kind::Dict) throw RuntimeFail("TypeError: namespace() positional arguments must be mappings");
      for (const auto& [k, x] : src.dict->items) v.ns->set(to_str(k), x);
    }
    for (const auto& [k, x] : a.keyword) v.ns->set(k, x);
    return v;
  });
  globals_["joiner"] = Value::callable("joiner", [](Interp&, const CallArgs& a) {
    const std::string sep = string_arg(a, 0, "sep").value_or(", ");
    auto used = std::make_shared<bool>(false);
    return Value::callable("joiner", [sep, used](Interp&, const CallArgs&) {
      if (!*used) {
        *used = true;
        return Value::string("");
      }
      return Value::string(sep);
    });
  });
  globals_["raise_exception"] = Value::callable("raise_exception", [](Interp&, const CallArgs& a) -> Value {
    const Value* message = a.get(0, "message");
    throw mt::Error("[chat_template] " + (message ? to_str(*message) : std::string()));
  });
  globals_["strftime_now"] = Value::callable("strftime_now", [](Interp&, const CallArgs& a) {
    const std::string format = string_arg(a, 0, "format").value_or("");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
    return Value::string(std::string(buf, n));
  });
}

}  // namespace mt::serve::chat_template_detail
