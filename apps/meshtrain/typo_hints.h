#pragma once
// What a mistyped command or flag was probably meant to be: "unknown command 'generat'; did
// you mean 'generate'?", "unknown flag '--lr' for pretrain; did you mean '--learning-rate'?".
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace mt::cli {

// When argv's first word is not a command of `app` (and not a flag): the message naming it and
// the nearest command.
std::optional<std::string> unknown_command_message(CLI::App& app, int argc, char** argv);
// Every flag in both spellings: `--learning_rate` for a command that spells it
// `--learning-rate` (and the reverse) is rewritten in `args` (argv without the program name)
// before parsing, so Hugging Face scripts' underscores work with every command.
void normalize_flag_spellings(CLI::App& app, std::vector<std::string>& args);
// After a parse that left arguments nobody takes: each unknown flag in the order typed, with
// the nearest flag of the command it was given to.
std::string unknown_flags_message(CLI::App& app, int argc, char** argv);

}  // namespace mt::cli
