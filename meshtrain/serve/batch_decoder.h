#pragma once
// The model side of continuous batching: sequences that each own a KV cache, prefilled one
// at a time and then decoded together, one token per sequence per step. Each row attends
// over its own cache (a ragged KvCache), so a sequence's logits do not depend on which
// others share its step, nor on their lengths.
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

  // One step of every row: row i feeds tokens[i] at the position after its cache, which
  // grows by one. Returns the next-token logits, rows × V (host f32).
  std::vector<float> decode(const std::vector<models::KvCache*>& caches, const std::vector<int64_t>& tokens) const;

  const models::CausalLm& model() const { return lm_; }
  int64_t vocab_size() const { return lm_.vocab_size; }
  // KV-cache bytes one token of one sequence takes (measured once, with a one-token prefill).
  int64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }

 private:
  models::CausalLm lm_;
  int64_t kv_bytes_per_token_ = 0;
};

}  // namespace mt::serve
