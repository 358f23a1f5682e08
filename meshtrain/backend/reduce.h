#pragma once
// The reduction kernels: cpu/reduce.cpp and cuda/reduce.cu.
#include <cstdint>

#include "meshtrain/core/array.h"

namespace mt::kernels {
enum class ReduceOp { sum, max, min };
}  // namespace mt::kernels

// reduce: x viewed as (outer, R, inner) reduced over R into out (outer, inner). Floating sums
//         accumulate in double so long reductions keep f32 results exact to rounding.
// argmax: the index of the first maximum along R; out is i64 (outer, inner).
#define MT_REDUCE_KERNELS                                                                              \
  void reduce(kernels::ReduceOp op, const Array& x, Array& out, int64_t outer, int64_t r, int64_t inner); \
  void argmax(const Array& x, Array& out, int64_t outer, int64_t r, int64_t inner);

namespace mt::cpu { MT_REDUCE_KERNELS }
namespace mt::cuda { MT_REDUCE_KERNELS }
