#include "meshtrain/data/example.h"

#include <charconv>
#include <cmath>

#include "meshtrain/core/error.h"

namespace mt::data {

namespace {

std::string_view trim_spaces(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string field_list(const std::vector<Example::Field>& fields) {
  std::string out;
  for (const auto& [name, value] : fields) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

const char* type_name(const Value& v) {
  switch (v.index()) {
    case 0: return "a string";
    case 1: return "an integer";
    case 2: return "a float";
    default: return "a token list";
  }
}

}  // namespace

std::string describe(const Value& value) {
  if (auto* s = std::get_if<std::string>(&value)) {
    return "'" + (s->size() > 40 ? s->substr(0, 37) + "..." : *s) + "'";
  }
  if (auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&value)) return detail::concat(*d);
  const auto& t = std::get<std::vector<int64_t>>(value);
  std::string out = "[";
  for (size_t k = 0; k < t.size() && k < 8; ++k) out += (k ? ", " : "") + std::to_string(t[k]);
  return out + (t.size() > 8 ? ", ... (" + std::to_string(t.size()) + " ids)]" : "]");
}

bool parse_int64(std::string_view text, int64_t& out) {
  text = trim_spaces(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return false;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && ptr == text.data() + text.size();
}

bool parse_float64(std::string_view text, double& out) {
  text = trim_spaces(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return false;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && ptr == text.data() + text.size();
}

Example::Example(std::initializer_list<Field> fields) {
  for (const auto& [name, value] : fields) set(name, value);
}

void Example::set(std::string name, Value value) {
  for (auto& field : fields_) {
    if (field.first == name) {
      field.second = std::move(value);
      return;
    }
  }
  fields_.emplace_back(std::move(name), std::move(value));
}

const Value* Example::find(std::string_view name) const {
  for (const auto& field : fields_) {
    if (field.first == name) return &field.second;
  }
  return nullptr;
}

const Value& Example::at(std::string_view name) const& {
  const Value* v = find(name);
  MT_CHECK(v != nullptr, "[Example] field '", name, "' is missing (fields: ", field_list(fields_), ")");
  return *v;
}

const std::string& Example::str(std::string_view name) const& {
  const Value& v = at(name);
  auto* s = std::get_if<std::string>(&v);
  MT_CHECK(s != nullptr, "[Example] field '", name, "' is ", type_name(v), " ", describe(v), ", not a string");
  return *s;
}

const std::vector<int64_t>& Example::tokens(std::string_view name) const& {
  const Value& v = at(name);
  auto* t = std::get_if<std::vector<int64_t>>(&v);
  MT_CHECK(t != nullptr, "[Example] field '", name, "' is ", type_name(v), " ", describe(v), ", not a token list");
  return *t;
}

// The rvalue overloads move the field out of the dying example.
Value Example::at(std::string_view name) && { return std::move(const_cast<Value&>(std::as_const(*this).at(name))); }
std::string Example::str(std::string_view name) && {
  return std::move(const_cast<std::string&>(std::as_const(*this).str(name)));
}
std::vector<int64_t> Example::tokens(std::string_view name) && {
  return std::move(const_cast<std::vector<int64_t>&>(std::as_const(*this).tokens(name)));
}

int64_t Example::as_int(std::string_view name) const {
  const Value& v = at(name);
  if (auto* i = std::get_if<int64_t>(&v)) return *i;
  if (auto* d = std::get_if<double>(&v)) {
    MT_CHECK(std::isfinite(*d) && std::trunc(*d) == *d && std::fabs(*d) < 9.2e18, "[Example] field '", name,
             "' is the float ", *d, ", not an integer");
    return int64_t(*d);
  }
  int64_t out = 0;
  auto* s = std::get_if<std::string>(&v);
  MT_CHECK(s != nullptr && parse_int64(*s, out), "[Example] field '", name, "' is ", type_name(v), " ",
           describe(v), ", not an integer");
  return out;
}

double Example::as_float(std::string_view name) const {
  const Value& v = at(name);
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (auto* i = std::get_if<int64_t>(&v)) return double(*i);
  double out = 0;
  auto* s = std::get_if<std::string>(&v);
  MT_CHECK(s != nullptr && parse_float64(*s, out), "[Example] field '", name, "' is ", type_name(v), " ",
           describe(v), ", not a number");
  return out;
}

std::vector<std::string> Example::names() const {
  std::vector<std::string> out;
  out.reserve(fields_.size());
  for (const auto& field : fields_) out.push_back(field.first);
  return out;
}

}  // namespace mt::data
