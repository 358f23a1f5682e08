#pragma once
// The softmax kernels: cpu/softmax.cpp and cuda/softmax.cu.
#include <cstdint>

#include "meshtrain/core/array.h"

// softmax_forward: softmax (log_softmax when `log`) of x viewed as (outer, R, inner), along R;
//   y has x's shape. Max-shifted and computed in f32 (sums in double) for every float dtype;
//   y has x's dtype.
// causal_softmax_forward: attention probabilities with a causal mask, fused: row i of each
//   (tq, tk) block of x (blocks, tq, tk) becomes softmax(scale · x[i, :n]) over its
//   n = i + (tk − tq) + 1 visible keys, zeros after. Equal to masking with the lowest finite
//   value and then softmax, in one pass instead of three.
// softmax_backward: the first-order VJP of a row softmax from its output y (rows, R), fused:
//   dx = scale · y · (g − Σ g·y) per row (sums in double, arithmetic in f32); g and dx have
//   y's shape and dtype. Masked (zero) probabilities give zero.
#define MT_SOFTMAX_KERNELS                                                                                   \
  void softmax_forward(const Array& x, Array& y, int64_t outer, int64_t r, int64_t inner, bool log);         \
  void causal_softmax_forward(const Array& x, Array& y, int64_t blocks, int64_t tq, int64_t tk, float scale); \
  void softmax_backward(const Array& y, const Array& g, Array& dx, int64_t rows, int64_t r, float scale);

namespace mt::cpu { MT_SOFTMAX_KERNELS }
namespace mt::cuda { MT_SOFTMAX_KERNELS }
