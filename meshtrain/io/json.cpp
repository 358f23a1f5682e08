#include "meshtrain/io/json.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "meshtrain/core/error.h"

namespace mt::io {

namespace {
std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "[json] ", path, ": cannot open: ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  MT_CHECK(!in.bad(), "[json] ", path, ": read failed");
  return ss.str();
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; keep the readable part
// (it already says "parse error at line L, column C: ...").
std::string strip_exception_id(const std::string& what) {
  size_t p = what.find("] ");
  return p == std::string::npos ? what : what.substr(p + 2);
}

std::string escape_pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

template <class Json>
Json parse_as(const std::string& text, const std::string& source) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(mt::detail::concat("[json] ", source, ": ", strip_exception_id(e.what())));
  }
}
}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& source) {
  return parse_as<nlohmann::json>(text, source);
}

nlohmann::json read_json_file(const std::string& path) { return parse_as<nlohmann::json>(read_text(path), path); }

nlohmann::ordered_json read_ordered_json_file(const std::string& path) {
  return parse_as<nlohmann::ordered_json>(read_text(path), path);
}

void JsonRef::fail(const std::string& message) const { throw Error("[json] " + where() + ": " + message); }

JsonRef JsonRef::at(const std::string& key) const {
  if (!value_->is_object()) fail(std::string("expected an object holding '") + key + "', got " + json_detail::json_type_name(*value_));
  auto it = value_->find(key);
  if (it == value_->end()) fail("missing key '" + key + "'");
  return JsonRef(*it, file_, pointer_ + "/" + escape_pointer_token(key));
}

JsonRef JsonRef::at(size_t index) const {
  if (!value_->is_array()) fail(std::string("expected an array, got ") + json_detail::json_type_name(*value_));
  if (index >= value_->size())
    fail("index " + std::to_string(index) + " is out of range for an array of " + std::to_string(value_->size()));
  return JsonRef((*value_)[index], file_, pointer_ + "/" + std::to_string(index));
}

size_t JsonRef::size() const {
  if (!value_->is_array() && !value_->is_object())
    fail(std::string("expected an array or object, got ") + json_detail::json_type_name(*value_));
  return value_->size();
}

std::vector<std::string> JsonRef::keys() const {
  if (!value_->is_object()) fail(std::string("expected an object, got ") + json_detail::json_type_name(*value_));
  std::vector<std::string> out;
  for (auto it = value_->begin(); it != value_->end(); ++it) out.push_back(it.key());
  return out;
}

namespace json_detail {
const char* json_type_name(const nlohmann::json& j) {
  if (j.is_number_float()) return "a float";
  if (j.is_number_integer()) return "an integer";
  if (j.is_boolean()) return "a boolean";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  if (j.is_null()) return "null";
  return j.type_name();
}
}  // namespace json_detail

}  // namespace mt::io
