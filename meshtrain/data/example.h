#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace mt::data {

// One field value: readers produce strings (or typed numbers when asked), JSONL keeps
// JSON's types, and text LM datasets produce token id lists.
using Value = std::variant<std::string, int64_t, double, std::vector<int64_t>>;

// A short human-readable rendering for error messages (long strings and lists elided).
std::string describe(const Value& value);

// One example: an ordered list of named fields, the C++ counterpart of the dict a Redco
// collate function receives. Lookups are linear: examples have a handful of fields.
class Example {
 public:
  using Field = std::pair<std::string, Value>;

  Example() = default;
  Example(std::initializer_list<Field> fields);

  // Replaces the value of an existing field in place, or appends a new field.
  void set(std::string name, Value value);
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const Value* find(std::string_view name) const;  // nullptr when absent
  // Throws mt::Error "[Example] field 'x' is missing (fields: a, b)".
  const Value& at(std::string_view name) const&;
  Value at(std::string_view name) &&;  // on a temporary (dataset.get(i).at(..)): a copy, never dangling

  // Typed access. str/tokens require that exact type; as_int/as_float also parse strings
  // ("1", " 4.750") and as_int accepts integral doubles, so TSV fields work unconverted.
  const std::string& str(std::string_view name) const&;
  std::string str(std::string_view name) &&;
  const std::vector<int64_t>& tokens(std::string_view name) const&;
  std::vector<int64_t> tokens(std::string_view name) &&;
  int64_t as_int(std::string_view name) const;
  double as_float(std::string_view name) const;

  std::vector<std::string> names() const;
  size_t size() const { return fields_.size(); }
  bool empty() const { return fields_.empty(); }
  std::vector<Field>::const_iterator begin() const { return fields_.begin(); }
  std::vector<Field>::const_iterator end() const { return fields_.end(); }
  bool operator==(const Example&) const = default;

 private:
  std::vector<Field> fields_;
};

// Strict whole-string numeric parsing (surrounding spaces allowed); false on any junk.
bool parse_int64(std::string_view text, int64_t& out);
bool parse_float64(std::string_view text, double& out);

}  // namespace mt::data
