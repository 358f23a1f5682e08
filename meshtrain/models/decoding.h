#pragma once
// The search loops of generation (greedy, sampling, beam search) over any model that can
// say, for each row of a batch, which token is likely next: a decoder over its prompts
// (generate.cpp) or an encoder-decoder over its sources (seq2seq_generate.cpp).
#include <cstdint>
#include <vector>

#include "meshtrain/models/generate.h"

namespace mt::models {

class DecodingState {
 public:
  virtual ~DecodingState() = default;
  virtual int64_t rows() const = 0;
  virtual int64_t vocab_size() const = 0;
  // Host f32 logits (rows × V) of each row's next token after its sequence so far.
  virtual std::vector<float> next_logits() = 0;
  // Appends one token per row.
  virtual void append(const std::vector<int64_t>& tokens) = 0;
  // Row i becomes row rows[i] (beam search expands and reorders rows).
  virtual void select_rows(const std::vector<int64_t>& rows) = 0;
  // Row r's whole sequence: prompt (or decoder start token) and the tokens appended.
  virtual const std::vector<int64_t>& sequence(int64_t row) const = 0;
};

// Generates at most `budget` new tokens per row of `state` (one row per prompt): beam search
// when config.num_beams > 1, else greedy or sampling. A row ends after one of `stops`.
GenerationResult run_search(DecodingState& state, const GenerationConfig& config, const std::vector<int64_t>& stops,
                            int64_t budget);

// Applies config's logit rules to one row's scores (logits or log-probabilities, V) given
// its sequence so far and its number of new tokens.
void apply_logit_rules(std::vector<float>& scores, const std::vector<int64_t>& sequence, int64_t new_tokens,
                       const GenerationConfig& config, const std::vector<int64_t>& stops);

// The rows' next-token logits: the last position of a model's (rows, T, V) logits, as host
// floats (gathered from every rank when the vocabulary is split over them).
std::vector<float> last_logits(const Array& logits, int64_t rows, int64_t vocab);

// Checks the settings every search shares (temperature, top-k/p, beams, rules) against a
// vocabulary; throws mt::Error naming the bad one.
void check_generation_config(const GenerationConfig& config, int64_t vocab_size);

}  // namespace mt::models
