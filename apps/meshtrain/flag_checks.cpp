#include "apps/meshtrain/flag_checks.h"

#include <optional>
#include <string>

namespace mt::cli {
namespace {

std::optional<int64_t> whole_integer(const std::string& text) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const auto v = whole_integer(text);
        return v && *v >= 1 ? "" : "must be a positive integer, got '" + text + "'";
      },
      "POSITIVE");
}

CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          size_t used = 0;
          if (std::stod(text, &used) >= 0 && used == text.size()) return "";
        } catch (const std::exception&) {
        }
        return "must be a number >= 0, got '" + text + "'";
      },
      "NONNEGATIVE");
}

CLI::Validator integer_range(int64_t lo, int64_t hi) {
  const std::string range = std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        const auto v = whole_integer(text);
        return v && *v >= lo && *v <= hi ? "" : "must be an integer from " + range + ", got '" + text + "'";
      },
      "INT in [" + range + "]");
}

CLI::Option* add_boolean_flag(CLI::App* cmd, const std::string& names, bool& value, const std::string& description) {
  // CLI11 (2.1) gives an option that appears without its value the default string: "true"
  // here, while the variable keeps its own default when the flag is absent.
  return cmd->add_option(names, value, description)
      ->expected(0, 1)
      ->default_str("true")
      ->option_text(std::string("[true|false]=") + (value ? "true" : "false"));
}

}  // namespace mt::cli
