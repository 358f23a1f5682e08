#pragma once
// Fused softmax cross-entropy over the last axis. Rows are processed in f32 whatever the
// logits dtype; only one (N,) f32 log-sum-exp per row is kept between forward and
// backward, never an (N, C) probability array.
#include <cstdint>

#include "meshtrain/core/array.h"

namespace mt::cpu {

// Per row i with label y = labels[i] (already validated: ignore_index or in [0, C)):
//   lse[i]  = log Σ_c exp(x[i, c])
//   loss[i] = (1 - ε)(lse[i] - x[i, y]) + ε (lse[i] - mean_c x[i, c]),  0 when y == ignore_index.
// logits: (N, C) floating   labels: (N,) i32/i64   loss: (N,) f32   lse: (N,) f32
void cross_entropy_forward(const Array& logits, const Array& labels, int64_t ignore_index, float smoothing, Array& loss,
                           Array& lse);

// grad[i, c] = (exp(x[i, c] - lse[i]) - ε / C - (1 - ε)[c == y]) * row_scale[i]; 0 for ignored rows.
// logits: (N, C)   labels: (N,)   lse: (N,) f32   row_scale: (N,) f32   grad: (N, C), logits' dtype
void cross_entropy_backward(const Array& logits, const Array& labels, const Array& lse, const Array& row_scale,
                            int64_t ignore_index, float smoothing, Array& grad);

}  // namespace mt::cpu
