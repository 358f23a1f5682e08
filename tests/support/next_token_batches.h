#pragma once
// Next-token batches for the small training tests: each example's "tokens" row of n + 1 ids
// gives `ids` (the first n) and `labels` (the last n); and GPT-2's loss on them.
#include <vector>

#include "meshtrain/meshtrain.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/train/trainer.h"

namespace mt::testing {

inline train::Batch next_token_batch(const std::vector<data::Example>& examples, int64_t length) {
  std::vector<int64_t> ids, labels;
  for (const data::Example& e : examples) {
    const std::vector<int64_t>& t = e.tokens("tokens");
    ids.insert(ids.end(), t.begin(), t.end() - 1);
    labels.insert(labels.end(), t.begin() + 1, t.end());
  }
  const int64_t n = int64_t(examples.size());
  return train::Batch{{"ids", Array::from_vector(ids, {n, length})}, {"labels", Array::from_vector(labels, {n, length})}};
}

inline auto next_token_collate(int64_t length) {
  return [length](const std::vector<data::Example>& examples) { return next_token_batch(examples, length); };
}

inline auto gpt2_next_token_loss(const models::Gpt2Config& c) {
  return [c](const Params& q, const train::Batch& b, const RngKey& k) {
    return cross_entropy(models::gpt2_apply(c, q, {.input_ids = b["ids"]}, k, true), b["labels"]);
  };
}

}  // namespace mt::testing
