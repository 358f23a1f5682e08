#pragma once
// Sharding rules of the engine's ops (DTensor-style propagation). Each returns a Rule for
// spmd_call: the layout to bring each input to, and the output's layout. When inputs
// disagree, the largest input keeps its layout and the others move (a replicated operand is
// cut locally, which costs no communication).
#include <vector>

#include "meshtrain/dist/spmd.h"

namespace mt::dist::rules {

// How partial sums may flow through an elementwise op.
enum class Linearity {
  none,      // nonlinear: partial inputs are summed first
  additive,  // add/sub: partial if every input is partial over the same axes
  scaling,   // mul/div-by-replicated, neg, cast: partial in at most one (the first for div) input
};

// n-ary elementwise op with NumPy broadcasting; output rank = max input rank.
Rule elementwise(Linearity linearity, bool first_only = false);
// a (..., M, K) @ b (..., K, N) (as stored: transposes read the other way). A contraction
// dim split over an axis yields an output partial over it; an axis splitting both a's
// non-contraction dims and b's is gathered on b (FSDP: the weight is gathered).
Rule matmul(bool trans_a, bool trans_b);
// sum over `axes`: reduced split dims give partial sums.
Rule reduce_sum(std::vector<int> axes, bool keepdims);
// max/min/argmax over `axes`: reduced dims are gathered first; partial inputs summed.
Rule reduce_gathered(std::vector<int> axes, bool keepdims);
// Output dims are input dims permuted: out dim i = in dim perm[i].
Rule transpose(std::vector<int> perm);
// Reshape to `out`: a split dim carries over when its block stays one contiguous block.
Rule reshape(Shape out);
// Unary op that needs `dims` of input 0 whole and no partial sums (slice, softmax over a
// dim, norms over the last dim, top_k...); other dims keep their split. Further inputs
// (weights) are replicated. The output has input 0's layout with `out_drop` dims removed.
Rule gather_dims(std::vector<int> dims, bool allow_partial = false);
// Concatenation along `axis`: inputs share the largest one's layout with `axis` whole.
Rule concatenate(int axis);
// broadcast_to(shape): existing dims keep their split, broadcast and new dims are whole.
Rule broadcast_to(Shape shape);
// embedding(table (V, D), ids): a vocab split of the table gives an output partial over
// those axes (masked local lookups); a hidden split carries to the output's last dim.
Rule embedding();
// cross_entropy(logits (..., C), labels (...)): classes whole, labels follow the logits'
// batch layout; `summed` outputs a partial scalar, otherwise the labels' layout.
Rule cross_entropy(bool summed);
// Stage one of vocab-parallel cross-entropy: logits keep their layout (classes split), labels
// follow the logits' batch layout, and the per-row statistics (..., 3) are partial over the
// class axes.
Rule vocab_parallel_statistics();
// Everything replicated: the always-correct fallback for ops without a better rule.
Rule replicate_all();

}  // namespace mt::dist::rules
