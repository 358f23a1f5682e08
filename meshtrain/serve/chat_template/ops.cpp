// Python's binary operators, `in`, int()/float() conversions and %-formatting for the chat
// template evaluator.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "meshtrain/serve/chat_template/eval.h"

namespace mt::serve::chat_template_detail {

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  throw RuntimeFail("TypeError: unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                    type_name(b) + "'");
}

// Python ints are unbounded; ours are 64-bit, and a result outside that range is an error.
[[noreturn]] void overflow() {
  throw RuntimeFail("OverflowError: integer result outside the 64-bit range this interpreter supports");
}

int64_t add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}

int64_t sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) overflow();
  return r;
}

int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value repeat(const Value& seq, int64_t times) {
  const size_t unit = seq.kind == Kind::String ? seq.s.size() : seq.list->size();
  if (times > 0 && unit > 0 && static_cast<uint64_t>(times) > (size_t{1} << 28) / unit)
    throw RuntimeFail("MemoryError: the repeated sequence would be too large");
  if (seq.kind == Kind::String) {
    std::string out;
    for (int64_t k = 0; k < times; ++k) out += seq.s;
    return Value::string(std::move(out), seq.markup);
  }
  List out;
  for (int64_t k = 0; k < times; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return seq.kind == Kind::Tuple ? Value::tuple_of(std::move(out)) : Value::list_of(std::move(out));
}

// Python's str -> number parsing: surrounding whitespace, a sign, digits with single '_'.
std::optional<std::string> clean_number(const std::string& text, bool allow_float) {
  std::string t = py_strip(text, std::nullopt, true, true);
  std::string out;
  for (size_t k = 0; k < t.size(); ++k) {
    const char c = t[k];
    if (c == '_') {
      if (k == 0 || k + 1 == t.size() || !std::isdigit(static_cast<unsigned char>(t[k - 1])) ||
          !std::isdigit(static_cast<unsigned char>(t[k + 1])))
        return std::nullopt;
      continue;
    }
    out.push_back(c);
  }
  if (out.empty()) return std::nullopt;
  size_t k = (out[0] == '+' || out[0] == '-') ? 1 : 0;
  if (k == out.size()) return std::nullopt;
  for (; k < out.size(); ++k) {
    const char c = out[k];
    if (std::isdigit(static_cast<unsigned char>(c))) continue;
    if (!allow_float) return std::nullopt;
    if (c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-') return std::nullopt;
  }
  return out;
}

}  // namespace

std::optional<double> to_float(const Value& v) {
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return v.as_double();
  if (v.kind != Kind::String) return std::nullopt;
  const std::string lowered = py_lower(py_strip(v.s, std::nullopt, true, true));
  const bool negative = !lowered.empty() && lowered[0] == '-';
  const std::string body = (!lowered.empty() && (lowered[0] == '-' || lowered[0] == '+')) ? lowered.substr(1) : lowered;
  if (body == "inf" || body == "infinity") return negative ? -INFINITY : INFINITY;
  if (body == "nan") return NAN;
  const auto cleaned = clean_number(v.s, true);
  if (!cleaned) return std::nullopt;
  char* end = nullptr;
  const double x = std::strtod(cleaned->c_str(), &end);
  if (end != cleaned->c_str() + cleaned->size()) return std::nullopt;
  return x;
}

std::optional<int64_t> to_int(const Value& v) {
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_integral()) return v.as_int();
  if (v.kind == Kind::Float) {
    if (!std::isfinite(v.f)) return std::nullopt;
    return static_cast<int64_t>(std::trunc(v.f));
  }
  if (v.kind != Kind::String) return std::nullopt;
  if (const auto cleaned = clean_number(v.s, false)) {
    try {
      return std::stoll(*cleaned);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  if (const auto f = to_float(v)) {
    if (!std::isfinite(*f)) return std::nullopt;
    return static_cast<int64_t>(std::trunc(*f));
  }
  return std::nullopt;
}

bool Interp::contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::Undefined: return false;
    case Kind::List:
    case Kind::Tuple:
      for (const Value& v : *container.list)
        if (equals(v, item)) return true;
      return false;
    case Kind::Dict:
      check_hashable(item);
      return container.dict->find(item) != nullptr;
    case Kind::String:
      if (item.kind != Kind::String)
        throw RuntimeFail("TypeError: 'in <string>' requires string as left operand, not " + type_name(item));
      return container.s.find(item.s) != std::string::npos;
    default: throw RuntimeFail("TypeError: argument of type '" + type_name(container) + "' is not iterable");
  }
}

Value Interp::binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::string(to_str(a) + to_str(b));
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool ints = a.is_integral() && b.is_integral();
  if (op == "+") {
    if (numbers) return ints ? Value::integer(add(a.as_int(), b.as_int())) : Value::floating(a.as_double() + b.as_double());
    if (a.kind == Kind::String && b.kind == Kind::String) {
      if (a.markup || b.markup)  // markupsafe: the plain side is escaped
        return Value::string((a.markup ? a.s : html_escape(a.s)) + (b.markup ? b.s : html_escape(b.s)), true);
      return Value::string(a.s + b.s);
    }
    if (a.is_sequence() && a.kind == b.kind) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return a.kind == Kind::Tuple ? Value::tuple_of(std::move(out)) : Value::list_of(std::move(out));
    }
    if (a.kind == Kind::String)
      throw RuntimeFail("TypeError: can only concatenate str (not \"" + type_name(b) + "\") to str");
    unsupported(op, a, b);
  }
  if (op == "-") {
    if (!numbers) unsupported(op, a, b);
    return ints ? Value::integer(sub(a.as_int(), b.as_int())) : Value::floating(a.as_double() - b.as_double());
  }
  if (op == "*") {
    if (numbers) return ints ? Value::integer(mul(a.as_int(), b.as_int())) : Value::floating(a.as_double() * b.as_double());
    if ((a.kind == Kind::String || a.is_sequence()) && b.is_integral()) return repeat(a, b.as_int());
    if ((b.kind == Kind::String || b.is_sequence()) && a.is_integral()) return repeat(b, a.as_int());
    throw RuntimeFail("TypeError: can't multiply sequence by non-int of type '" + type_name(b) + "'");
  }
  if (op == "%" && a.kind == Kind::String) return Value::string(percent_format(a.s, b));
  if (!numbers) unsupported(op, a, b);
  if (op == "/") {
    if (b.as_double() == 0) throw RuntimeFail(ints ? "ZeroDivisionError: division by zero" : "ZeroDivisionError: float division by zero");
    return Value::floating(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (ints) {
      if (b.as_int() == 0) throw RuntimeFail("ZeroDivisionError: integer division or modulo by zero");
      return Value::integer(op == "//" ? floor_div(a.as_int(), b.as_int()) : floor_mod(a.as_int(), b.as_int()));
    }
    const double x = a.as_double(), y = b.as_double();
    if (y == 0) throw RuntimeFail(op == "//" ? "ZeroDivisionError: float floor division by zero" : "ZeroDivisionError: float modulo");
    // CPython's float_divmod
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    if (op == "%") return Value::floating(mod);
    double floordiv;
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
      floordiv = std::copysign(0.0, x / y);
    }
    return Value::floating(floordiv);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t result = 1, base = a.as_int();
      for (int64_t e = b.as_int(); e > 0; e >>= 1) {
        if (e & 1) result = mul(result, base);
        if (e > 1) base = mul(base, base);
      }
      return Value::integer(result);
    }
    if (a.as_double() == 0 && b.as_double() < 0)
      throw RuntimeFail("ZeroDivisionError: 0.0 cannot be raised to a negative power");
    return Value::floating(std::pow(a.as_double(), b.as_double()));
  }
  unsupported(op, a, b);
}

std::string percent_format(const std::string& fmt, const Value& args) {
  List values;
  const Dict* mapping = nullptr;
  // Python: a right operand with __getitem__ that is no tuple or str (a dict, a list) is one
  // value and never "not all arguments converted".
  const bool mapping_like = args.kind == Kind::Dict || args.kind == Kind::List;
  if (args.kind == Kind::Tuple) values = *args.list;
  else values.push_back(args);
  if (args.kind == Kind::Dict) mapping = args.dict.get();
  size_t next_arg = 0;
  std::string out;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out.push_back(fmt[k]);
      continue;
    }
    if (++k >= fmt.size()) throw RuntimeFail("ValueError: incomplete format");
    const Value* arg = nullptr;
    if (fmt[k] == '(') {
      const size_t close = fmt.find(')', k);
      if (close == std::string::npos || !mapping) throw RuntimeFail("TypeError: format requires a mapping");
      arg = mapping->find(fmt.substr(k + 1, close - k - 1));
      if (!arg) throw RuntimeFail("KeyError: '" + fmt.substr(k + 1, close - k - 1) + "'");
      k = close + 1;
    }
    std::string spec = "%";
    while (k < fmt.size() && std::string("-+ 0#").find(fmt[k]) != std::string::npos) spec.push_back(fmt[k++]);
    while (k < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[k])) || fmt[k] == '.')) spec.push_back(fmt[k++]);
    if (k >= fmt.size()) throw RuntimeFail("ValueError: incomplete format");
    const char conv = fmt[k];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!arg) {
      if (next_arg >= values.size()) throw RuntimeFail("TypeError: not enough arguments for format string");
      arg = &values[next_arg++];
    }
    char buf[512];
    if (conv == 's' || conv == 'r' || conv == 'a') {
      const std::string text = conv == 's' ? to_str(*arg) : to_repr(*arg);
      std::snprintf(buf, sizeof buf, (spec + "s").c_str(), text.c_str());
      out += spec == "%" ? text : std::string(buf);
    } else if (conv == 'd' || conv == 'i' || conv == 'u' || conv == 'x' || conv == 'X' || conv == 'o') {
      if (!arg->is_number()) throw RuntimeFail("TypeError: %" + std::string(1, conv) + " format: a real number is required, not " + type_name(*arg));
      const long long n = arg->kind == Kind::Float ? static_cast<long long>(std::trunc(arg->f)) : arg->as_int();
      std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' || conv == 'u' ? 'd' : conv)).c_str(), n);
      out += buf;
    } else if (std::string("fFeEgG").find(conv) != std::string::npos) {
      if (!arg->is_number()) throw RuntimeFail("TypeError: must be real number, not " + type_name(*arg));
      std::snprintf(buf, sizeof buf, (spec + conv).c_str(), arg->as_double());
      out += buf;
    } else {
      throw RuntimeFail(std::string("ValueError: unsupported format character '") + conv + "'");
    }
  }
  if (!mapping_like && next_arg < values.size())
    throw RuntimeFail("TypeError: not all arguments converted during string formatting");
  return out;
}

}  // namespace mt::serve::chat_template_detail
