#pragma once
#include <vector>

#include "meshtrain/core/array.h"

namespace mt {

// A view with a new shape; one dim may be -1 (inferred).
Array reshape(const Array& x, std::vector<int64_t> shape);
// out.dim(i) = x.dim(perm[i]); copies.
Array transpose(const Array& x, std::vector<int> perm);
// Swaps two axes (the common transpose).
Array swap_axes(const Array& x, int a, int b);
// x[..., start:stop, ...] along `axis` (negative start/stop count from the end; clamped like Python).
Array slice(const Array& x, int axis, int64_t start, int64_t stop);
Array concatenate(const std::vector<Array>& xs, int axis);
Array stack(const std::vector<Array>& xs, int axis);
// Splits `x` along `axis` into pieces of the given sizes.
std::vector<Array> split(const Array& x, const std::vector<int64_t>& sizes, int axis);
Array broadcast_to(const Array& x, const Shape& shape);
// Sums `x` down to `shape` (the adjoint of broadcast_to).
Array sum_to(const Array& x, const Shape& shape);
Array expand_dims(const Array& x, int axis);
Array squeeze(const Array& x, int axis);
// Zeros of `full` shape with `x` placed at [start, start + x.dim(axis)) along axis (slice's adjoint).
Array pad_into(const Array& x, const Shape& full, int axis, int64_t start);

}  // namespace mt
