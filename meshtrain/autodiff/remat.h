#pragma once
// Activation checkpointing ("rematerialization", like jax.checkpoint and
// torch.utils.checkpoint): a function whose intermediates are not kept for the backward
// pass but recomputed there, trading one more forward of `f` for its activations' memory.
//
//   Array y = mt::checkpoint([&](const Params& bp, const std::vector<Array>& xs) {
//     return block(bp, xs[0]);
//   }, p.with_prefix("h.3"), {x});
//
// Rules, so that the recomputation equals the stored path bit for bit:
// - every traced array f reads must come in through `params` or `inputs` (arrays captured
//   from outside that carry a gradient are refused by name when the backward pass runs);
// - randomness comes from explicit counter-based keys (dropout keys), so the rerun draws
//   the same masks.
// Under nested differentiation (a grad inside a grad) and when nothing is traced, f simply
// runs stored: higher-order terms need the stored graph.
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/array.h"

namespace mt {

using CheckpointFn = std::function<Array(const Params& params, const std::vector<Array>& inputs)>;

Array checkpoint(const CheckpointFn& f, const Params& params, const std::vector<Array>& inputs);

// What the models' training forward recomputes in backward (--remat):
//   none   every activation is stored;
//   block  each transformer block keeps only its input and is rerun in backward;
//   full   blocks as above, and the output head with its loss runs over token chunks whose
//          logits are recomputed in backward, so (B, T, vocab) logits never exist whole.
enum class Remat { none, block, full };
Remat parse_remat(const std::string& name);  // "none" | "block" | "full", else mt::Error
const char* remat_name(Remat r);

}  // namespace mt
