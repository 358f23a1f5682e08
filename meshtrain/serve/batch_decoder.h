#pragma once
// The model side of continuous batching: prompts prefilled into an ordinary KV cache (alone,
// or several together, left-padded), whose positions the runner then copies into the paged
// one; then sequences decoded together, one token per sequence per step, over a paged KV cache (paged_kv_cache.h). Each
// row attends to its own positions only, so a sequence's logits do not depend on which others
// share its step, nor on their lengths.
#include <cstdint>
#include <vector>

#include "meshtrain/models/causal_lm.h"

namespace mt::serve {

class BatchDecoder {
 public:
  explicit BatchDecoder(models::CausalLm lm);

  // Runs the prompt through the model into `cache` (emptied first) and returns the logits
  // (V,) of the token after it: the call generate() makes for a lone prompt.
  std::vector<float> prefill(const std::vector<int64_t>& prompt, models::KvCache& cache) const;

  // Several prompts in one forward pass, left-padded to the longest (padding masked, positions
  // counted from each prompt's first token, as generate() runs a batch): `cache` gets (n, Hkv,
  // T, D) per layer, prompt i in its last prompts[i].size() positions. Returns the logits
  // n × V of each prompt's next token.
  std::vector<float> prefill_batch(const std::vector<std::vector<int64_t>>& prompts, models::KvCache& cache) const;

  // One step of every row: row i feeds tokens[i] at position step.rows.lengths[i] - 1, its
  // keys and values going to step.slots[i]. Returns the next-token logits, rows × V (host f32).
  std::vector<float> decode(models::PagedKvStep& step, const std::vector<int64_t>& tokens) const;

  const models::CausalLm& model() const { return lm_; }
  int64_t vocab_size() const { return lm_.vocab_size; }
  // KV-cache bytes one token of one sequence takes (measured once, with a one-token prefill).
  int64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }

 private:
  models::CausalLm lm_;
  int64_t kv_bytes_per_token_ = 0;
};

}  // namespace mt::serve
