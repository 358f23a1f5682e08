#pragma once
// The language-model loss with the output head recomputed in chunks (--remat full): the
// (B, T, vocab) logits, usually the largest activation of a small-width model with a big
// vocabulary, never exist whole, in the forward or the backward pass.
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/array.h"

namespace mt::models {

// The logits a chunk holds at most by default.
inline constexpr int64_t kChunkLogits = int64_t(1) << 22;

// logits = head(head_params, hidden) for hidden states (B, Tc, C).
using HeadFn = std::function<Array(const Params& head_params, const Array& hidden)>;

// The parameters under `head_prefixes` (a ModelSpec's): what the output head reads.
Params head_params_of(const std::vector<std::string>& head_prefixes, const Params& p);
// The vocabulary a head produces, for sizing chunks: the first dim of its widest matrix
// ([vocab, C] for every model here).
int64_t head_vocab(const Params& head_params);
// Positions per chunk of a head over (batch, positions) hidden states: at most chunk_logits
// logits of `vocab` at once, and at least 4 chunks, so the logits never exist whole.
int64_t head_chunk_positions(int64_t batch, int64_t positions, int64_t vocab, int64_t chunk_logits);

// Mean cross-entropy of head(hidden) against labels (B, T) (label -100 = ignored), computed
// over chunks of at most `chunk_logits` logits (whole positions of every row, the vocab
// taken as the first dim of the widest head matrix) and at least 4 chunks; each
// chunk is checkpointed, so its logits are recomputed in backward and freed at once. Equal to
// cross_entropy(head(hidden), labels) up to the order of the f32 sums.
Array chunked_lm_loss(const Array& hidden, const Array& labels, const HeadFn& head, const Params& head_params,
                      int64_t chunk_logits = kChunkLogits);

}  // namespace mt::models
