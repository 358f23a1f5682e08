#pragma once
// Completions sampled from a decoder by the serving engine (paged KV cache, continuous
// batching, temperature / top-p / top-k): GRPO's rollouts and its held-out evaluation. The
// prompts are submitted as one request each with n choices, so a finished completion's room
// goes to the next prompt's at once. Under mpirun every rank takes part — rank 0 runs the
// engine, the others run its model steps on their shards (serve/broadcast_runner.h) — and
// every rank receives rank 0's completions, so all hold the same samples.
#include <cstdint>
#include <vector>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/models/pretrained.h"

namespace mt::posttrain {

struct SamplingOptions {
  int64_t n = 1;                   // completions per prompt
  int64_t max_new_tokens = 64;
  double temperature = 1.0;        // 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;               // prompt p's choice j draws from (seed + p, j): reproducible
  std::vector<int64_t> stop_tokens;  // end a completion (kept as its last token)
  int64_t max_batch = 64;          // sequences decoded together at most
  // Sample only the first vocab_limit ids (0: all): a vocabulary padded past the tokenizer's
  // ids (for divisible shards) never yields an id the tokenizer cannot decode.
  int64_t vocab_limit = 0;
};

struct SampledCompletions {
  // Choice p·n + j is prompt p's j-th completion: its tokens, the stop token included when
  // one ended it.
  std::vector<std::vector<int64_t>> tokens;
  std::vector<bool> stopped;  // ended by a stop token (else by the length limit)
  int64_t generated_tokens = 0;
  double seconds = 0;  // wall time of the generation (rank 0's)
};

// `params` in any layout of the model's (a Trainer's, LoRA adapters included), used as they
// are (cast them for compute first). Call on every rank with the same prompts.
SampledCompletions sample_completions(const models::PretrainedModel& model, const Params& params,
                                      const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& options);

}  // namespace mt::posttrain
