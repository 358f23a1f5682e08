#include "apps/meshtrain/jsonl_objects.h"

#include <fstream>

#include "meshtrain/core/error.h"

namespace mt::cli {

void for_each_json_object(const std::string& path, const std::string& command,
                          const std::function<void(const nlohmann::json& row, const std::string& at)>& fn) {
  std::ifstream in(path);
  MT_CHECK(in, "[", command, "] cannot read ", path);
  size_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = "[" + command + "] " + path + ":" + std::to_string(line_no) + ": ";
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    MT_CHECK(!row.is_discarded() && row.is_object(), at, "not a JSON object");
    fn(row, at);
  }
}

std::string keys_of(const nlohmann::json& row) {
  std::string k;
  for (const auto& [key, v] : row.items()) k += (k.empty() ? "" : ", ") + key;
  return k;
}

const nlohmann::json& required_field(const nlohmann::json& row, const std::string& name, const std::string& at) {
  MT_CHECK(row.contains(name), at, "no '", name, "' field (fields: ", keys_of(row), ")");
  return row[name];
}

}  // namespace mt::cli
