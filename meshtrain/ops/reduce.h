#pragma once
#include <vector>

#include "meshtrain/core/array.h"

namespace mt {

// Reductions over `axes` (negative allowed; empty = all axes).
Array sum(const Array& x, std::vector<int> axes = {}, bool keepdims = false);
Array mean(const Array& x, std::vector<int> axes = {}, bool keepdims = false);
// Max: the gradient is shared evenly among tied maxima (torch.amax semantics).
Array max(const Array& x, std::vector<int> axes = {}, bool keepdims = false);
Array min(const Array& x, std::vector<int> axes = {}, bool keepdims = false);
Array logsumexp(const Array& x, std::vector<int> axes = {}, bool keepdims = false);
// Index (i64) of the first maximum along `axis`.
Array argmax(const Array& x, int axis, bool keepdims = false);

// Sorted, unique, non-negative axes; empty input means all axes.
std::vector<int> normalize_axes(const Shape& shape, std::vector<int> axes, const char* op);

}  // namespace mt
