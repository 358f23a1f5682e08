#include "apps/meshtrain/typo_hints.h"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <vector>

#include "meshtrain/core/spelling.h"

namespace mt::cli {

namespace {

std::vector<std::string> command_names(CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  return names;
}

// Every long and short name of the command's options ("--learning-rate", "--learning_rate", "-h").
std::vector<std::string> flag_names(const CLI::App& command) {
  std::vector<std::string> names;
  for (const CLI::Option* o : command.get_options()) {
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : o->get_snames()) names.push_back("-" + s);
  }
  return names;
}

// Abbreviations other trainers' scripts use, which no spelling distance finds.
std::string conventional_flag(const std::string& flag) {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"--lr", "--learning-rate"}, {"--bs", "--per-device-batch-size"}, {"--batch-size", "--per-device-batch-size"},
      {"--out", "--output-dir"},   {"--wd", "--weight-decay"},
      // Hugging Face's TrainingArguments switches, as meshtrain spells them.
      {"--bf16", "--precision bf16"}, {"--fp16", "--precision f16"}, {"--tf32", "--precision tf32"}};
  for (const auto& [abbreviation, flag_name] : table)
    if (flag == abbreviation) return flag_name;
  return "";
}

}  // namespace

void normalize_flag_spellings(CLI::App& app, std::vector<std::string>& args) {
  if (args.empty()) return;
  CLI::App* command = nullptr;
  for (CLI::App* sub : app.get_subcommands({}))
    if (sub->get_name() == args[0]) command = sub;
  if (!command) return;
  const std::vector<std::string> known = flag_names(*command);
  const auto knows = [&](const std::string& f) { return std::find(known.begin(), known.end(), f) != known.end(); };
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    const size_t eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    if (knows(flag)) continue;
    std::string other = flag;
    const bool underscores = other.find('_') != std::string::npos;
    for (size_t k = 2; k < other.size(); ++k)
      if (other[k] == (underscores ? '_' : '-')) other[k] = underscores ? '-' : '_';
    if (knows(other)) a = other + (eq == std::string::npos ? "" : a.substr(eq));
  }
}

std::optional<std::string> unknown_command_message(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return std::nullopt;
  const std::string word = argv[1];
  const std::vector<std::string> names = command_names(app);
  for (const std::string& n : names)
    if (n == word) return std::nullopt;
  const std::string near = nearest_spelling(word, names);
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return "unknown command '" + word + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?") +
         " (commands: " + list + ")";
}

std::string unknown_flags_message(CLI::App& app, int argc, char** argv) {
  const std::vector<CLI::App*> parsed = app.get_subcommands();
  const CLI::App& command = parsed.empty() ? app : *parsed.front();
  const std::vector<std::string> known = flag_names(command);
  const std::vector<std::string> left = parsed.empty() ? app.remaining() : parsed.front()->remaining();
  std::ostringstream out;
  // In the order typed: walk argv and report each argument the parse left over.
  std::vector<std::string> pending(left.begin(), left.end());
  bool after_unknown_flag = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto it = std::find(pending.begin(), pending.end(), arg);
    if (it == pending.end()) {
      after_unknown_flag = false;
      continue;
    }
    pending.erase(it);
    const bool is_flag = arg.size() > 1 && arg[0] == '-' && !std::isdigit(static_cast<unsigned char>(arg[1]));
    if (!is_flag && after_unknown_flag) {  // the value of the unknown flag before it
      after_unknown_flag = false;
      continue;
    }
    if (!out.str().empty()) out << "\n";
    if (is_flag) {
      const std::string flag = arg.substr(0, arg.find('='));
      std::string near = conventional_flag(flag);  // "--precision bf16": the flag is its first word
      if (near.empty() || std::find(known.begin(), known.end(), near.substr(0, near.find(' '))) == known.end())
        near = nearest_spelling(flag, known);
      out << "unknown flag '" << flag << "' for " << command.get_name()
          << (near.empty() ? "" : "; did you mean '" + near + "'?");
      after_unknown_flag = arg.find('=') == std::string::npos;
    } else {
      out << "unexpected argument '" << arg << "' for " << command.get_name() << " (values follow their flag)";
    }
  }
  out << "\nRun with --help for the flags of " << command.get_name() << ".";
  return out.str();
}

}  // namespace mt::cli
