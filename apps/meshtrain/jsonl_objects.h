#pragma once
// JSON-lines files whose rows hold more than flat fields (chat-message lists), as dpo and grpo
// read them: each line a JSON object, every error naming the file and the line.
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace mt::cli {

// Calls fn(row, at) for each line of `path` in order, blank lines skipped; `at` is
// "[command] path:line: ", the prefix of any error about the row. A line that is not a JSON
// object, or an unreadable file, is an error naming it.
void for_each_json_object(const std::string& path, const std::string& command,
                          const std::function<void(const nlohmann::json& row, const std::string& at)>& fn);

// "a, b, c": a row's keys, for errors that say what a row has.
std::string keys_of(const nlohmann::json& row);

// row[name], or an error at `at` naming the field and the row's keys.
const nlohmann::json& required_field(const nlohmann::json& row, const std::string& name, const std::string& at);

}  // namespace mt::cli
