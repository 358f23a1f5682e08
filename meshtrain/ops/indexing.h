#pragma once
// Gathers, scatters and top-k. Index arrays are i32 or i64; an index outside [0, size)
// (negative ones included: there is no Python-style wrap-around) throws mt::Error naming
// the op, the index value and the shapes.
#include <cstdint>
#include <optional>
#include <utility>

#include "meshtrain/core/array.h"

namespace mt {

// Whole slices of `x` along `axis` (np.take / torch.index_select with any index shape):
// out.shape = x.shape[:axis] + indices.shape + x.shape[axis+1:]. VJP: scatter_add.
Array take(const Array& x, const Array& indices, int axis);

// Zeros of `shape` plus `updates` summed into the slices `indices` names along `axis`
// (repeated indices accumulate): the adjoint of take, whose VJP is take.
// updates.shape must be shape[:axis] + indices.shape + shape[axis+1:].
Array scatter_add(const Shape& shape, const Array& indices, const Array& updates, int axis);

// torch.gather: out[c] = x[c with c[axis] replaced by indices[c]]. indices has x's rank
// and indices.dim(d) <= x.dim(d) for d != axis; out has indices' shape.
Array take_along_axis(const Array& x, const Array& indices, int axis);

// torch.Tensor.scatter_add_ into zeros of `shape`: the adjoint of take_along_axis.
Array scatter_add_along_axis(const Shape& shape, const Array& indices, const Array& updates, int axis);

// Rows of a (V, D) table: ids of any shape -> ids.shape + (D,). The backward pass sums
// the cotangent rows of repeated ids without data races (each table row has one owner).
// padding_idx (nn.Embedding's): positions holding it add nothing to the table's gradient, so
// the padding row is not trained by its lookups (HF's BERT and BART embeddings).
Array embedding(const Array& table, const Array& ids, std::optional<int64_t> padding_idx = std::nullopt);

// ids.shape + (num_classes,) with a 1 at each id.
Array one_hot(const Array& ids, int64_t num_classes, DType dtype = DType::f32);

// The k largest entries along `axis`, sorted descending: {values, indices (i64)}.
// Ties keep the lower index first (like jax.lax.top_k; torch.topk leaves tie order
// unspecified); NaN ranks above every number. Values are differentiable.
std::pair<Array, Array> top_k(const Array& x, int64_t k, int axis = -1);

}  // namespace mt
