// The filters of the chat template interpreter (`x|trim`, `xs|map(attribute='content')`, ...),
// with jinja2 3.1's definitions and transformers' `tojson` (json.dumps, ensure_ascii=False).
// Generators jinja returns (map, select, reverse, items) are lists here.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "meshtrain/serve/chat_template/eval.h"

namespace mt::serve::chat_template_detail {

namespace {

const char* const kFilters[] = {"abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort",
                                "e", "escape", "first", "float", "forceescape", "format", "indent", "int", "items",
                                "join", "last", "length", "list", "lower", "map", "max", "min", "reject",
                                "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort",
                                "string", "sum", "title", "tojson", "trim", "truncate", "unique", "upper",
                                "wordcount"};

// jinja2's make_attrgetter: "a.b.0" looks up item a, then b, then index 0.
Value attr_get(Interp& in, const Value& item, const Value& attribute) {
  if (attribute.kind != Kind::String) return in.get_item(item, attribute);
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = attribute.s.find('.', start);
    const std::string part = attribute.s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = in.get_item(cur, digits ? Value::integer(std::stoll(part)) : Value::string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// The sort key of sort/unique/min/max/dictsort: strings lowercased unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.kind == Kind::String) return Value::string(py_lower(v.s));
  return v;
}

int64_t length_of(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return 0;
    case Kind::String: return static_cast<int64_t>(utf8_length(v.s));
    case Kind::List:
    case Kind::Tuple: return static_cast<int64_t>(v.list->size());
    case Kind::Dict: return static_cast<int64_t>(v.dict->items.size());
    default: throw RuntimeFail("TypeError: object of type '" + type_name(v) + "' has no len()");
  }
}

std::string py_round_text(double x, int64_t digits) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::clamp<int64_t>(digits, 0, 300)), x);
  return buf;
}

// jinja2's do_title: each run after one of -, whitespace, ( { [ < starts upper, the rest lower.
std::string jinja_title(const std::string& s) {
  const std::u32string t = utf8_decode(s);
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  std::string out;
  bool start = true;
  for (char32_t c : t) {
    if (is_sep(c)) {
      utf8_append(out, c);
      start = true;
    } else {
      utf8_append(out, start ? cp_upper(c) : cp_lower(c));
      start = false;
    }
  }
  return out;
}

std::string do_indent(std::string s, const Value* width, bool first, bool blank) {
  std::string indention = "    ";
  if (width && width->kind == Kind::String) indention = width->s;
  else if (width && width->is_integral()) indention = std::string(static_cast<size_t>(std::max<int64_t>(0, width->as_int())), ' ');
  s += "\n";
  const std::vector<std::string> lines = py_splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + indention : "") + lines[k];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? "" : indention + lines[k]);
  }
  return first ? indention + rv : rv;
}

}  // namespace

bool has_filter(const std::string& name) {
  for (const char* f : kFilters)
    if (name == f) return true;
  return false;
}

Value Interp::apply_filter(const std::string& name, const Value& v, const CallArgs& a) {
  if (name == "default" || name == "d") {
    const Value* fallback = a.get(0, "default_value");
    const bool boolean = bool_arg(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !truthy(v))) return fallback ? *fallback : Value::string("");
    return v;
  }
  if (name == "length" || name == "count") return Value::integer(length_of(v));
  if (name == "string") return v.kind == Kind::String ? v : Value::string(to_str(v));
  if (name == "safe") return Value::string(to_str(v), true);
  if (name == "e" || name == "escape" || name == "forceescape") {
    if (v.kind == Kind::String && v.markup && name != "forceescape") return v;
    return Value::string(html_escape(to_str(v)), true);
  }
  if (name == "upper") return Value::string(py_upper(to_str(v)));
  if (name == "lower") return Value::string(py_lower(to_str(v)));
  if (name == "capitalize") return Value::string(py_capitalize(to_str(v)));
  if (name == "title") return Value::string(jinja_title(to_str(v)));
  if (name == "trim") return Value::string(py_strip(to_str(v), string_arg(a, 0, "chars"), true, true));
  if (name == "replace") {
    const Value& old = required_arg(a, 0, "old", "replace");
    const Value& with = required_arg(a, 1, "new", "replace");
    return Value::string(py_replace(to_str(v), to_str(old), to_str(with), int_arg(a, 2, "count", -1)));
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : utf8_decode(to_str(v))) {
      const bool w = c == '_' || cp_is_alnum(c);
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value::integer(n);
  }
  if (name == "center") {
    const int64_t width = int_arg(a, 0, "width", 80);
    const std::string s = to_str(v);
    const int64_t pad = width - static_cast<int64_t>(utf8_length(s));
    if (pad <= 0) return Value::string(s);
    const int64_t left = pad / 2 + (pad & width & 1);
    return Value::string(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(pad - left), ' '));
  }
  if (name == "indent") {
    if (v.is_undefined()) fail_undefined(v);
    if (v.kind != Kind::String) throw RuntimeFail("TypeError: indent needs a string, not " + type_name(v));
    return Value::string(do_indent(v.s, a.get(0, "width"), bool_arg(a, 1, "first", false), bool_arg(a, 2, "blank", false)));
  }
  if (name == "truncate") {
    const std::u32string s = utf8_decode(to_str(v));
    const int64_t length = int_arg(a, 0, "length", 255);
    const bool killwords = bool_arg(a, 1, "killwords", false);
    const std::u32string end = utf8_decode(string_arg(a, 2, "end").value_or("..."));
    const int64_t leeway = int_arg(a, 3, "leeway", 5);
    if (length < static_cast<int64_t>(end.size())) throw RuntimeFail("AssertionError: expected length >= " + std::to_string(end.size()));
    if (static_cast<int64_t>(s.size()) <= length + leeway) return Value::string(utf8_encode(s));
    std::u32string head = s.substr(0, static_cast<size_t>(length) - end.size());
    if (!killwords) {
      const size_t space = head.rfind(U' ');
      if (space != std::u32string::npos) head.resize(space);
    }
    return Value::string(utf8_encode(head + end));
  }
  if (name == "format") {
    if (!a.keyword.empty()) {
      Dict d;
      for (const auto& [k, x] : a.keyword) d.set(Value::string(k), x);
      return Value::string(percent_format(to_str(v), Value::dict_of(std::move(d))));
    }
    return Value::string(percent_format(to_str(v), Value::tuple_of(a.positional)));
  }
  if (name == "int") {
    const int64_t fallback = int_arg(a, 0, "default", 0);
    const int64_t base = int_arg(a, 1, "base", 10);
    if (v.kind == Kind::String && base != 10) {
      try {
        size_t used = 0;
        const std::string t = py_strip(v.s, std::nullopt, true, true);
        const int64_t x = std::stoll(t, &used, static_cast<int>(base));
        if (used == t.size()) return Value::integer(x);
      } catch (const std::exception&) {
      }
    }
    const auto x = to_int(v);
    return Value::integer(x ? *x : fallback);
  }
  if (name == "float") {
    const Value* fallback = a.get(0, "default");
    const auto x = to_float(v);
    if (x) return Value::floating(*x);
    return fallback ? *fallback : Value::floating(0.0);
  }
  if (name == "abs") {
    if (v.is_undefined()) fail_undefined(v);
    if (v.kind == Kind::Float) return Value::floating(std::fabs(v.f));
    if (v.is_integral()) return v.as_int() < 0 ? binary_op("-", Value::integer(0), v) : Value::integer(v.as_int());
    throw RuntimeFail("TypeError: bad operand type for abs(): '" + type_name(v) + "'");
  }
  if (name == "round") {
    const int64_t precision = int_arg(a, 0, "precision", 0);
    const std::string method = string_arg(a, 1, "method").value_or("common");
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_number()) throw RuntimeFail("TypeError: type " + type_name(v) + " doesn't define __round__ method");
    if (method == "common") {
      if (v.is_integral()) return Value::integer(v.as_int());
      if (!std::isfinite(v.f) || precision < 0) return Value::floating(v.f);
      return Value::floating(std::strtod(py_round_text(v.f, precision).c_str(), nullptr));
    }
    if (method != "ceil" && method != "floor") throw RuntimeFail("FilterArgumentError: method must be common, ceil or floor");
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = v.as_double() * scale;
    return Value::floating((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (name == "tojson") {
    JsonOptions o;
    o.ensure_ascii = bool_arg(a, 0, "ensure_ascii", false);
    if (const Value* indent = a.get(1, "indent"); indent && indent->kind != Kind::None) {
      if (indent->kind == Kind::String) o.indent = indent->s;
      else if (indent->is_integral()) o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent->as_int())), ' ');
      else throw RuntimeFail("TypeError: indent must be an int or a str");
      o.item_separator = ",";
    }
    if (const Value* separators = a.get(2, "separators"); separators && separators->kind != Kind::None) {
      const List parts = iterate(*separators);
      if (parts.size() != 2 || parts[0].kind != Kind::String || parts[1].kind != Kind::String)
        throw RuntimeFail("ValueError: separators must be a pair of strings");
      o.item_separator = parts[0].s;
      o.key_separator = parts[1].s;
    }
    o.sort_keys = bool_arg(a, 3, "sort_keys", false);
    return Value::string(json_dumps(v, o));
  }
  if (name == "attr") {
    const std::string attribute = to_str(required_arg(a, 0, "name", "attr"));
    if (v.kind == Kind::Dict && !(attribute == "keys" || attribute == "values" || attribute == "items" ||
                                  attribute == "get" || attribute == "copy"))
      return Value::undefined("'dict object' has no attribute '" + attribute + "'");
    return get_attr(v, attribute);
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::list_of({});
    if (v.kind != Kind::Dict) throw RuntimeFail("TypeError: Can only get item pairs from a mapping.");
    List out;
    for (const auto& [k, x] : v.dict->items) out.push_back(Value::tuple_of({k, x}));
    return Value::list_of(std::move(out));
  }
  if (name == "dictsort") {
    if (v.kind != Kind::Dict) throw RuntimeFail("TypeError: dictsort needs a mapping");
    const bool case_sensitive = bool_arg(a, 0, "case_sensitive", false);
    const std::string by = string_arg(a, 1, "by").value_or("key");
    const bool reverse = bool_arg(a, 2, "reverse", false);
    if (by != "key" && by != "value") throw RuntimeFail("FilterArgumentError: You can only sort by either \"key\" or \"value\"");
    List out;
    for (const auto& [k, x] : v.dict->items) out.push_back(Value::tuple_of({k, x}));
    const size_t pos = by == "key" ? 0 : 1;
    std::stable_sort(out.begin(), out.end(), [&](const Value& l, const Value& r) {
      const int c = compare(sort_key((*l.list)[pos], case_sensitive), sort_key((*r.list)[pos], case_sensitive));
      return reverse ? c > 0 : c < 0;
    });
    return Value::list_of(std::move(out));
  }
  // --- filters over the items of an iterable ---
  if (name == "first") {
    const List items = iterate(v);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  if (name == "last") {
    const List items = iterate(v);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  }
  if (name == "list") return Value::list_of(iterate(v));
  if (name == "reverse") {
    if (v.kind == Kind::String) {
      std::u32string t = utf8_decode(v.s);
      std::reverse(t.begin(), t.end());
      return Value::string(utf8_encode(t), v.markup);
    }
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list_of(std::move(items));
  }
  if (name == "join") {
    const std::string sep = to_str(a.get(0, "d") ? *a.get(0, "d") : Value::string(""));
    const Value* attribute = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      out += (first ? "" : sep) + to_str(attribute && attribute->kind != Kind::None ? attr_get(*this, item, *attribute) : item);
      first = false;
    }
    return Value::string(out);
  }
  if (name == "map") {
    List out;
    const List items = truthy(v) ? iterate(v) : List();  // jinja maps nothing over a falsy value
    if (!a.positional.empty()) {
      const std::string filter = to_str(a.positional[0]);
      if (!has_filter(filter)) throw RuntimeFail("FilterArgumentError: no filter named '" + filter + "'");
      CallArgs rest;
      rest.positional.assign(a.positional.begin() + 1, a.positional.end());
      rest.keyword = a.keyword;
      for (const Value& item : items) out.push_back(apply_filter(filter, item, rest));
      return Value::list_of(std::move(out));
    }
    const Value* attribute = a.keyword_only("attribute");
    if (!attribute) throw RuntimeFail("FilterArgumentError: map requires a filter name or attribute=");
    const Value* fallback = a.keyword_only("default");
    for (const Value& item : items) {
      Value x = attr_get(*this, item, *attribute);
      out.push_back(x.is_undefined() && fallback ? *fallback : x);
    }
    return Value::list_of(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_when = name == "select" || name == "selectattr";
    const size_t test_at = by_attr ? 1 : 0;
    if (by_attr && a.positional.empty()) throw RuntimeFail("TypeError: " + name + " needs an attribute");
    std::string test;
    CallArgs test_args;
    if (a.positional.size() > test_at) {
      test = to_str(a.positional[test_at]);
      if (!has_test(test)) throw RuntimeFail("TemplateRuntimeError: No test named '" + test + "'.");
      test_args.positional.assign(a.positional.begin() + static_cast<long>(test_at) + 1, a.positional.end());
      test_args.keyword = a.keyword;
    }
    List out;
    for (const Value& item : truthy(v) ? iterate(v) : List()) {
      const Value subject = by_attr ? attr_get(*this, item, a.positional[0]) : item;
      const bool ok = test.empty() ? truthy(subject) : apply_test(test, subject, test_args);
      if (ok == keep_when) out.push_back(item);
    }
    return Value::list_of(std::move(out));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    const bool is_sort = name == "sort";
    const bool reverse = is_sort && bool_arg(a, 0, "reverse", false);
    const bool case_sensitive = bool_arg(a, is_sort ? 1 : 0, "case_sensitive", false);
    const Value* attribute = a.get(is_sort ? 2 : 1, "attribute");
    const bool has_attribute = attribute && attribute->kind != Kind::None;
    List items = iterate(v);
    auto key = [&](const Value& item) {
      return sort_key(has_attribute ? attr_get(*this, item, *attribute) : item, case_sensitive);
    };
    if (name == "unique") {
      List out, seen;
      for (const Value& item : items) {
        const Value k = key(item);
        check_hashable(k);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
          seen.push_back(k);
          out.push_back(item);
        }
      }
      return Value::list_of(std::move(out));
    }
    if (!is_sort) {
      if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      size_t best = 0;
      for (size_t k = 1; k < items.size(); ++k) {
        const int c = compare(key(items[k]), key(items[best]));
        if (name == "min" ? c < 0 : c > 0) best = k;
      }
      return items[best];
    }
    std::stable_sort(items.begin(), items.end(), [&](const Value& l, const Value& r) {
      const int c = compare(key(l), key(r));
      return reverse ? c > 0 : c < 0;
    });
    return Value::list_of(std::move(items));
  }
  if (name == "sum") {
    const Value* attribute = a.get(0, "attribute");
    Value total = a.get(1, "start") ? *a.get(1, "start") : Value::integer(0);
    for (const Value& item : iterate(v))
      total = binary_op("+", total, attribute && attribute->kind != Kind::None ? attr_get(*this, item, *attribute) : item);
    return total;
  }
  if (name == "batch") {
    const int64_t count = int_arg(a, 0, "linecount", 1);
    if (count <= 0) throw RuntimeFail("ValueError: batch size must be positive");
    const Value* fill = a.get(1, "fill_with");
    List out, tmp;
    for (const Value& item : iterate(v)) {
      if (static_cast<int64_t>(tmp.size()) == count) {
        out.push_back(Value::list_of(std::move(tmp)));
        tmp.clear();
      }
      tmp.push_back(item);
    }
    if (!tmp.empty()) {
      if (fill && fill->kind != Kind::None)
        while (static_cast<int64_t>(tmp.size()) < count) tmp.push_back(*fill);
      out.push_back(Value::list_of(std::move(tmp)));
    }
    return Value::list_of(std::move(out));
  }
  throw RuntimeFail("no filter named '" + name + "'");
}

}  // namespace mt::serve::chat_template_detail
