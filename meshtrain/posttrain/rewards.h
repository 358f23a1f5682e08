#pragma once
// Rewards for GRPO: functions of (prompt, completion, example) scoring a batch of
// completions at once. Built in: exact_match:FIELD (the completion's answer — its first line,
// spaces trimmed — equals the example's FIELD), numeric:FIELD (the last number in the
// completion equals FIELD's number), format:REGEX (1 when the completion matches REGEX
// entirely, ECMAScript syntax). Any program can score too (command_reward): it reads one
// JSON object per completion on stdin ({"prompt", "completion", and the example's fields})
// and writes one number per line, so rewards can be written in any language.
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/data/example.h"

namespace mt::posttrain {

struct RewardInput {
  std::string prompt, completion;
  const data::Example* example = nullptr;  // the prompt's row (its reference answer, ...)
};

struct RewardFunction {
  std::string name;  // logged as rewards/<name>
  std::function<std::vector<double>(const std::vector<RewardInput>&)> score;
};

RewardFunction exact_match_reward(const std::string& field);
RewardFunction numeric_reward(const std::string& field);
RewardFunction format_reward(const std::string& regex);  // throws naming a bad regex
// `command` run by the shell once per batch; a non-zero exit (its stderr shown), a line that
// is not a number or a count other than one per completion throws naming the command.
RewardFunction command_reward(const std::string& command);

// "exact_match:answer,format:^\\d+$": comma-separated built-ins (a comma belongs to the
// previous item unless a known kind follows it, so regexes may hold commas). Throws naming an
// unknown kind or an empty spec.
std::vector<RewardFunction> parse_rewards(const std::string& spec);

// The fields each built-in reads ("answer" of exact_match:answer): checked against the data
// before training starts.
std::vector<std::string> reward_fields(const std::string& spec);

// The text of field `name` of an example (strings as they are, numbers printed); throws when absent.
std::string field_text(const data::Example& example, const std::string& name);

}  // namespace mt::posttrain
