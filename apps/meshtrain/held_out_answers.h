#pragma once
// Greedy answers to held-out prompts, compared with the responses they should give: how
// finetune and dpo show, before and after training, what a model now answers.
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/models/pretrained.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/train/deployer.h"

namespace mt::cli {

// The greedy continuation of `prompt` (encoded with its special tokens, as training does)
// under `params`, up to new_tokens or the end-of-text id, decoded without the prompt.
std::string greedy_completion(const models::PretrainedModel& model, const Params& params, const tokenizers::Tokenizer& tok,
                              const std::string& prompt, int64_t new_tokens, std::optional<int64_t> eos);

// How many of the first `rows` prompts get exactly (spaces around trimmed) their response;
// logs the first three exchanges and the count, tagged `when` ("before", "after").
int64_t exact_answers(const models::PretrainedModel& model, const Params& params, const tokenizers::Tokenizer& tok,
                      const std::vector<std::string>& prompts, const std::vector<std::string>& responses, int64_t rows,
                      int64_t new_tokens, std::optional<int64_t> eos, const std::string& when,
                      const train::Deployer& deployer);

}  // namespace mt::cli
