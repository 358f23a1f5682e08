#pragma once
// Sharding rules of the engine's primitives (DTensor-style propagation), as pure functions of
// the inputs' global shapes and layouts and of the mesh's axis sizes: the layout to bring each
// input to, and the output's layout. Each primitive names its rule (Primitive::sharding); the
// distributed layer applies it. When inputs disagree, the largest input keeps its layout and
// the others move (a replicated operand is cut locally, which costs no communication).
#include <string>
#include <vector>

#include "meshtrain/core/dtype.h"
#include "meshtrain/core/shape.h"
#include "meshtrain/layout/mesh_shape.h"
#include "meshtrain/layout/partition_spec.h"

namespace mt::layout {

// One input as a rule sees it.
struct ArgInfo {
  Shape shape;  // global
  PartitionSpec spec;
  DType dtype = DType::f32;
  bool defined = true;
};
struct RuleResult {
  std::vector<PartitionSpec> inputs;  // the layout each input must be brought to
  PartitionSpec output;
};

namespace rules {

using Args = std::vector<ArgInfo>;

// How partial sums may flow through an elementwise op.
enum class Linearity {
  none,      // nonlinear: partial inputs are summed first
  additive,  // add/sub: partial if every input is partial over the same axes
  scaling,   // mul/div-by-replicated, neg, cast: partial in at most one (the first for div) input
};

// n-ary elementwise op with NumPy broadcasting; output rank = max input rank.
RuleResult elementwise(const Args& in, const MeshShape& mesh, Linearity linearity, bool first_only = false);
// a (..., M, K) @ b (..., K, N) (as stored: transposes read the other way). A contraction
// dim split over an axis yields an output partial over it; an axis splitting both a's
// non-contraction dims and b's is gathered on b (FSDP: the weight is gathered).
RuleResult matmul(const Args& in, const MeshShape& mesh, bool trans_a, bool trans_b);
// sum over `axes`: reduced split dims give partial sums.
RuleResult reduce_sum(const Args& in, const MeshShape& mesh, const std::vector<int>& axes, bool keepdims);
// max/min/argmax over `axes`: reduced dims are gathered first; partial inputs summed.
RuleResult reduce_gathered(const Args& in, const MeshShape& mesh, const std::vector<int>& axes, bool keepdims);
// Output dims are input dims permuted: out dim i = in dim perm[i].
RuleResult transpose(const Args& in, const MeshShape& mesh, const std::vector<int>& perm);
// Reshape to `out`: a split dim carries over when its block stays one contiguous block.
RuleResult reshape(const Args& in, const MeshShape& mesh, const Shape& out);
// Op that needs `dims` of input 0 whole and no partial sums (slice, softmax over a dim,
// norms over the last dim...); other dims keep their split. Further inputs (weights) are
// replicated. The output has input 0's layout.
RuleResult gather_dims(const Args& in, const MeshShape& mesh, const std::vector<int>& dims,
                       bool allow_partial = false);
// Concatenation along `axis`: inputs share the largest one's layout with `axis` whole.
RuleResult concatenate(const Args& in, const MeshShape& mesh, int axis);
// broadcast_to(shape): existing dims keep their split, broadcast and new dims are whole.
RuleResult broadcast_to(const Args& in, const MeshShape& mesh, const Shape& shape);
// embedding(table (V, D), ids): the ids keep their split and the table is gathered over
// the axes they use; a vocab split of the table gives an output partial over those axes
// (masked local lookups); a hidden split carries to the output's last dim.
RuleResult embedding(const Args& in, const MeshShape& mesh);
// cross_entropy(logits (..., C), labels (...)): classes whole, labels follow the logits'
// batch layout; `summed` outputs a partial scalar, otherwise the labels' layout.
RuleResult cross_entropy(const Args& in, const MeshShape& mesh, bool summed);
// Vocab-parallel cross-entropy's per-row statistics: logits keep their layout (classes
// split), labels and the row maxima follow the logits' batch layout, and the statistics
// (..., 3) are partial over the class axes.
RuleResult vocab_parallel_statistics(const Args& in, const MeshShape& mesh);
// Everything replicated: the always-correct fallback for ops without a better rule.
RuleResult replicate_all(const Args& in, const MeshShape& mesh);

}  // namespace rules
}  // namespace mt::layout
