#pragma once
// Flag forms that read as a user expects. Numeric validators whose failures say "--seq-len:
// must be a positive integer, got '0'", where CLI11's own PositiveNumber and NonNegativeNumber
// print a range up to a 300-digit double, and its Range calls a word that is no number "not in
// range". And boolean flags that take an optional value, as Hugging Face's argument parser
// does: `--pad_to_max_length`, `--pad_to_max_length false`, `--pad_to_max_length=no`.
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace mt::cli {

// Integers >= 1.
CLI::Validator positive();
// Numbers >= 0 (integers or decimals; the option's own type then parses them).
CLI::Validator non_negative();
// Integers from lo to hi.
CLI::Validator integer_range(int64_t lo, int64_t hi);

// A boolean flag whose value is optional: the flag alone means true; true/false, 1/0, yes/no
// and on/off are read; the help shows `[true|false]=` and `value`'s default.
CLI::Option* add_boolean_flag(CLI::App* cmd, const std::string& names, bool& value, const std::string& description);

}  // namespace mt::cli
