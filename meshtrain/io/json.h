#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

namespace mt::io {

// Parses a JSON file; errors name the file and the line/column of a syntax error.
nlohmann::json read_json_file(const std::string& path);
// Same, keeping object keys in file order (index files, tokenizer vocabularies).
nlohmann::ordered_json read_ordered_json_file(const std::string& path);
// Parses JSON text; `source` names it in errors (a file name or "<header of x>").
nlohmann::json parse_json(const std::string& text, const std::string& source);

// A JSON value plus where it came from (file and JSON pointer), so that a missing or
// mistyped key is reported as "[json] config.json: /num_heads: expected an integer, got
// string". It refers to `value`: the document must outlive it.
class JsonRef {
 public:
  JsonRef(const nlohmann::json& value, std::string file, std::string pointer = "")
      : value_(&value), file_(std::move(file)), pointer_(std::move(pointer)) {}

  const nlohmann::json& value() const { return *value_; }
  const std::string& file() const { return file_; }
  const std::string& pointer() const { return pointer_; }  // "" for the root, "/a/0/b" below
  std::string where() const { return file_ + ": " + (pointer_.empty() ? "/" : pointer_); }

  // True for an object holding `key` (even with a null value).
  bool contains(const std::string& key) const { return value_->is_object() && value_->contains(key); }
  // The member `key`; throws naming the file and path when this is not an object or the key is missing.
  JsonRef at(const std::string& key) const;
  JsonRef at(size_t index) const;
  size_t size() const;  // of an array or object; throws for scalars
  std::vector<std::string> keys() const;  // of an object

  // Strict conversions: an integer type needs a JSON integer in range, a floating type any
  // number, bool a boolean, std::string a string, std::vector<T> an array of T,
  // std::map<std::string, T> an object of T. Anything else throws naming file and path.
  template <class T>
  T as() const;
  template <class T>
  T get(const std::string& key) const {
    return at(key).as<T>();
  }
  // `fallback` when the key is missing or null; a present value of the wrong type throws.
  template <class T>
  T get_or(const std::string& key, T fallback) const {
    if (!contains(key) || (*value_)[key].is_null()) return fallback;
    return at(key).as<T>();
  }

  [[noreturn]] void fail(const std::string& message) const;

 private:
  const nlohmann::json* value_;
  std::string file_, pointer_;
};

namespace json_detail {
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_string_map : std::false_type {};
template <class T>
struct is_string_map<std::map<std::string, T>> : std::true_type {};
const char* json_type_name(const nlohmann::json& j);
}  // namespace json_detail

template <class T>
T JsonRef::as() const {
  const nlohmann::json& j = *value_;
  auto wrong = [&](const char* expected) {
    fail(std::string("expected ") + expected + ", got " + json_detail::json_type_name(j));
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!j.is_boolean()) wrong("a boolean");
    return j.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!j.is_number_integer()) wrong("an integer");
    if (j.is_number_unsigned()) {
      uint64_t v = j.get<uint64_t>();
      if (v > uint64_t(std::numeric_limits<T>::max())) fail("integer " + std::to_string(v) + " is out of range");
      return T(v);
    }
    int64_t v = j.get<int64_t>();
    if (v < int64_t(std::numeric_limits<T>::min()) ||
        (v > 0 && uint64_t(v) > uint64_t(std::numeric_limits<T>::max())))
      fail("integer " + std::to_string(v) + " is out of range");
    return T(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!j.is_number()) wrong("a number");
    return j.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!j.is_string()) wrong("a string");
    return j.get<std::string>();
  } else if constexpr (json_detail::is_vector<T>::value) {
    if (!j.is_array()) wrong("an array");
    T out;
    out.reserve(j.size());
    for (size_t i = 0; i < j.size(); ++i) out.push_back(at(i).template as<typename T::value_type>());
    return out;
  } else if constexpr (json_detail::is_string_map<T>::value) {
    if (!j.is_object()) wrong("an object");
    T out;
    for (auto it = j.begin(); it != j.end(); ++it) out.emplace(it.key(), at(it.key()).template as<typename T::mapped_type>());
    return out;
  } else {
    static_assert(sizeof(T) == 0, "JsonRef::as: unsupported type");
  }
}

}  // namespace mt::io
