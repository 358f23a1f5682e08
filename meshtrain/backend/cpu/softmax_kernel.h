#pragma once
#include <cstdint>

#include "meshtrain/core/array.h"

namespace mt::cpu {

// Softmax (log_softmax when `log`) of x viewed as (outer, R, inner), along R. Max-shifted
// and computed in f32 (sums in double) for every float dtype; y has x's dtype.
void softmax_forward(const Array& x,  // (outer, R, inner)
                     Array& y,        // (outer, R, inner)
                     int64_t outer, int64_t r, int64_t inner, bool log);

// Attention probabilities with a causal mask, fused: row i of each (tq, tk) block of x
// becomes softmax(scale · x[i, :n]) over its n = i + (tk − tq) + 1 visible keys, zeros after.
// Equal to masking with the lowest finite value and then softmax, in one pass instead of three.
void causal_softmax_forward(const Array& x,  // (blocks, tq, tk)
                            Array& y,        // (blocks, tq, tk)
                            int64_t blocks, int64_t tq, int64_t tk, float scale);
// The first-order VJP of a row softmax from its output, fused: dx = scale · y · (g − Σ g·y)
// per row (sums in double, arithmetic in f32). Masked (zero) probabilities give zero.
void softmax_backward(const Array& y,  // (rows, R)
                      const Array& g,  // (rows, R), y's dtype
                      Array& dx,       // (rows, R), y's dtype
                      int64_t rows, int64_t r, float scale);

}  // namespace mt::cpu
