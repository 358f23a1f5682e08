#pragma once
// Text generation for decoder models: greedy, temperature / top-k / top-p sampling and beam
// search, with a KV cache, stop tokens and batched prompts (left-padded, with an attention
// mask and position ids). Runs without autodiff recording. Sampling draws from a
// counter-based key (seed, step, row), so a run is reproducible whatever the thread count.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "meshtrain/models/causal_lm.h"

namespace mt::models {

struct GenerationConfig {
  int64_t max_new_tokens = 32;
  // 0: greedy (argmax). > 0: sample from softmax(logits / temperature).
  double temperature = 0.0;
  int64_t top_k = 0;    // sampling keeps the k most likely tokens; 0 = all
  double top_p = 1.0;   // sampling keeps the smallest set of most likely tokens with mass >= top_p
  // > 1: beam search (deterministic; temperature, top-k and top-p do not apply). A finished
  // hypothesis scores sum(log p) / (new tokens)^length_penalty.
  int64_t num_beams = 1;
  double length_penalty = 1.0;
  // Beam search stops a prompt once num_beams hypotheses are finished (true) or once no
  // running beam can beat the worst finished one (false, HF's default heuristic).
  bool early_stopping = false;
  // A row ends after emitting one of these (kept in its output). Empty = the model's
  // stop_tokens; to generate without stopping, set ignore_model_stop_tokens.
  std::vector<int64_t> stop_tokens;
  bool ignore_model_stop_tokens = false;
  int64_t pad_token_id = 0;  // fills prompts on the left and finished rows
  uint64_t seed = 0;
  bool use_cache = true;       // false: recompute the whole sequence at every step (reference)
  bool return_logits = false;  // keep each step's raw next-token logits (B·beams, V)
  // Logit rules applied before each choice, as Hugging Face's logits processors (a banned
  // token gets -inf; a forced token gets log-probability 0 in beam scores):
  // stop tokens are banned until this many new tokens exist (HF min_new_tokens; for an
  // encoder-decoder, HF's min_length counts the decoder start token: min_length - 1);
  int64_t min_new_tokens = 0;
  // > 0: a token that would repeat an n-gram of this size already in the row's sequence
  // (prompt or decoder start token included) is banned;
  int64_t no_repeat_ngram_size = 0;
  // the first new token, and the token at the last step max_new_tokens allows (BART).
  std::optional<int64_t> forced_bos_token_id{};
  std::optional<int64_t> forced_eos_token_id{};
};

struct GenerationResult {
  // New tokens per prompt (a final stop token included). Generation also ends when the
  // sequence reaches the model's max_positions.
  std::vector<std::vector<int64_t>> tokens;
  std::vector<double> scores;  // beam search: the chosen hypothesis' score; else sum of log p
  std::vector<Array> step_logits;  // with return_logits: one (rows, V) f32 array per step
};

GenerationResult generate(const CausalLm& lm, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationConfig& config = {});

// Beam search whatever num_beams (>= 1); generate() uses it when num_beams > 1. With one
// beam it reduces to greedy decoding.
GenerationResult beam_search(const CausalLm& lm, const std::vector<std::vector<int64_t>>& prompts,
                             const GenerationConfig& config);

// The next-token choice of one row from its logits (V,), as generate applies it: greedy
// when temperature is 0, else the filtered distribution sampled with uniform `u` in [0, 1).
int64_t choose_token(std::span<const float> logits, const GenerationConfig& config, double u);

// log(sum(exp(x))) of a row of n logits, in double (the log-probability normalizer).
double log_sum_exp(const float* x, int64_t n);

// Left-pads prompts to the longest: ids (B, T) and mask (B, T) i64.
std::pair<Array, Array> left_pad(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_token_id);

}  // namespace mt::models
