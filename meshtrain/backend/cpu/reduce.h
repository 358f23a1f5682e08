#pragma once
#include <cstdint>

#include "meshtrain/core/array.h"

namespace mt::cpu {

enum class ReduceOp { sum, max, min };

// x viewed as (outer, R, inner) reduced over R into out (outer, inner). Floating sums
// accumulate in double so long reductions keep f32 results exact to rounding.
void reduce(ReduceOp op, const Array& x, Array& out, int64_t outer, int64_t r, int64_t inner);
// Index of the first maximum along R; out is i64 (outer, inner).
void argmax(const Array& x, Array& out, int64_t outer, int64_t r, int64_t inner);

}  // namespace mt::cpu
