#pragma once
// Preference data for `meshtrain dpo`: JSONL rows of a prompt and two responses, the chosen
// and the rejected one — text fields read through the same {prompt}{response} template as
// finetune's, or conversations (lists of {"role", "content"} messages, TRL's conversational
// form: an explicit "prompt" list, or chosen/rejected conversations sharing their opening
// turns) rendered by the model's chat template.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "meshtrain/data/dataset.h"
#include "meshtrain/serve/openai_protocol.h"
#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::cli {

struct PreferenceFlags {
  std::string data;
  std::string prompt_field = "prompt", chosen_field = "chosen", rejected_field = "rejected";
  std::string template_text = "{prompt}{response}";
  std::string chat_template;  // a template file for conversational rows (default: the model's)
  int64_t seq_len = 128;
  double eval_fraction = 0.1;  // the file's last rows, held out
  bool pad_to_max_length = false;  // every batch seq_len long, not cut after its last target
  // preference_collate's pad multiple: each side of a batch cut after its last target (a
  // multiple of 8), unless --pad-to-max-length.
  int64_t pad_multiple() const { return pad_to_max_length ? 0 : 8; }
};
void add_preference_flags(CLI::App* cmd, PreferenceFlags& flags);

struct PreferenceCorpus {
  // posttrain::preference_example's examples.
  std::shared_ptr<const data::Dataset> train, eval;
  int64_t rows = 0, eval_rows = 0;
  int64_t truncated = 0;  // pairs cut to fit a sequence
  bool conversational = false;
  // The held-out rows' prompts as generation sees them and their chosen responses (text rows).
  std::vector<std::string> eval_prompts, eval_chosen;
};

// Every row of --data as a preference pair. A line that is not a JSON object, a row without
// the chosen or rejected field (or, for text rows, the prompt), a conversation whose prompt
// the template does not render as a prefix, or an empty file is an error naming the file and
// the line. `chat` carries the chat template for conversations (none: "role: content" lines).
PreferenceCorpus make_preference_corpus(const PreferenceFlags& flags, const tokenizers::Tokenizer& tok,
                                        std::optional<int64_t> eos_id, const serve::ServedModel& chat);

}  // namespace mt::cli
