#include "meshtrain/data/jsonl_reader.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "meshtrain/core/error.h"
#include "meshtrain/data/text_file.h"

namespace mt::data {

namespace {

using Json = nlohmann::ordered_json;  // keeps each line's key order

Value to_value(const Json& j, const std::string& where, const std::string& key) {
  switch (j.type()) {
    case Json::value_t::string: return j.get<std::string>();
    case Json::value_t::boolean: return int64_t(j.get<bool>());
    case Json::value_t::number_integer: return j.get<int64_t>();
    case Json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      MT_CHECK(u <= uint64_t(std::numeric_limits<int64_t>::max()), "[read_jsonl] ", where, ": key '", key, "': ", u,
               " does not fit in int64");
      return int64_t(u);
    }
    case Json::value_t::number_float: return j.get<double>();
    case Json::value_t::array: {
      std::vector<int64_t> ids;
      ids.reserve(j.size());
      for (const auto& e : j) {
        if (e.is_number_integer() && (!e.is_number_unsigned() ||
                                      e.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()))) {
          ids.push_back(e.get<int64_t>());
        } else {
          return j.dump();
        }
      }
      // An empty array is ambiguous; it is most likely an empty id list.
      return ids;
    }
    default: return j.dump();
  }
}

}  // namespace

std::vector<Example> read_jsonl(const std::string& path, const JsonlOptions& options) {
  const std::string text = read_text_file(path, "read_jsonl");
  std::vector<Example> rows;
  size_t pos = 0;
  int64_t line = 0;
  while (pos < text.size() && (options.limit < 0 || int64_t(rows.size()) < options.limit)) {
    ++line;
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view content(text.data() + pos, end - pos);
    pos = end + 1;
    if (content.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    Json j;
    try {
      j = Json::parse(content);
    } catch (const Json::parse_error& e) {
      // e.byte is the 1-based offset within the line where parsing failed.
      std::string what = e.what();
      const size_t colon = what.find(": ", what.find("column"));
      MT_CHECK(false, "[read_jsonl] ", path, ":", line, ":", e.byte, ": bad JSON: ",
               colon == std::string::npos ? what : what.substr(colon + 2));
    }
    const std::string where = detail::concat(path, ":", line);
    MT_CHECK(j.is_object(), "[read_jsonl] ", where, ": expected a JSON object, found ", j.type_name());
    Example ex;
    if (options.columns.empty()) {
      for (const auto& [key, value] : j.items()) ex.set(key, to_value(value, where, key));
    } else {
      for (const auto& key : options.columns) {
        auto it = j.find(key);
        if (it == j.end()) {
          std::string keys;
          for (const auto& [k, v] : j.items()) keys += (keys.empty() ? "'" : ", '") + k + "'";
          MT_CHECK(false, "[read_jsonl] ", where, ": missing column '", key, "' (the line has ",
                   keys.empty() ? "no keys" : keys, ")");
        }
        ex.set(key, to_value(*it, where, key));
      }
    }
    rows.push_back(std::move(ex));
  }
  return rows;
}

}  // namespace mt::data
