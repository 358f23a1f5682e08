#pragma once
// Preference pairs as training examples: a prompt and two responses, the chosen one and the
// rejected one, each tokenized as prompt + response in a sequence of its own whose targets are
// the response tokens only (the prompt is context, the padding nothing).
#include <cstdint>
#include <vector>

#include "meshtrain/data/example.h"
#include "meshtrain/train/trainer.h"

namespace mt::posttrain {

struct PreferencePair {
  std::vector<int64_t> prompt, chosen, rejected;  // responses end with the end-of-text id
};

// {"chosen_tokens", "chosen_targets", "rejected_tokens", "rejected_targets"}, each
// seq_len + 1 ids: prompt + response padded with pad_id, targets -100 except on the
// response. A pair that does not fit keeps the end of its prompt (at most half the sequence)
// and the start of its responses; `truncated` is set then. An empty response is an error.
data::Example preference_example(const PreferencePair& pair, int64_t seq_len, int64_t pad_id, bool* truncated = nullptr);

// Examples of preference_example (and with_reference_logps's fields) -> chosen_input_ids,
// chosen_labels, rejected_input_ids, rejected_labels (B, seq_len) (labels: the next token's
// target) and, when present, ref_chosen_logps, ref_rejected_logps, ref_chosen_tokens,
// ref_rejected_tokens (B,) f32. pad_multiple > 0: both sides cut after the batch's last
// target on either side, rounded up to a multiple of pad_multiple (a causal decoder: no
// earlier position sees what is cut, and it holds no target).
train::CollateFn preference_collate(int64_t pad_multiple = 0);
// The fields preference_collate(pad_multiple > 0) cuts, one length group: for
// Trainer/Predictor::set_padded_fields.
std::vector<train::PaddedFields> preference_padded_fields();

}  // namespace mt::posttrain
