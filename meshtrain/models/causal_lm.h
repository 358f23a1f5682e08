#pragma once
// A decoder language model as generation sees it: one forward function over
// (ids, mask, positions) with an optional KV cache, whatever the architecture.
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/models/common.h"

namespace mt::models {

struct CausalLm {
  std::string model_type;  // "gpt2", "llama", "minigpt"
  int64_t vocab_size = 0;
  int64_t max_positions = 0;  // learned position tables bound the length; 0 = no bound
  std::vector<int64_t> stop_tokens;  // the model's end-of-sequence ids (defaults for generation)
  // Logits (B, T, V) of the inputs (evaluation mode), (B, n, V) under in.logits_to_keep = n;
  // `cache` may be null.
  std::function<Array(const DecoderInputs&, KvCache*)> forward;
};

// Each decoder's factory lives beside its model (gpt2_causal_lm in gpt2.h, ...); its closure
// holds the config and the Params handles (no copy of the weights).

// The model seen through its first `vocab_size` logits: a vocabulary padded past the
// tokenizer's ids (for divisible shards) never yields an id the tokenizer cannot decode.
CausalLm restrict_vocab(CausalLm lm, int64_t vocab_size);

}  // namespace mt::models
