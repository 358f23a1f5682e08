#pragma once
// Fused softmax cross-entropy over the last axis: cpu/loss.cpp and cuda/loss.cu. Rows are
// processed in f32 whatever the logits dtype; only one (N,) f32 log-sum-exp per row is kept
// between forward and backward, never an (N, C) probability array.
#include <cstdint>

#include "meshtrain/core/array.h"

// The classes are the first C columns of each logits row of width W = logits.dim(-1) >= C; the
// columns past C are padding (a GEMM's output padded to an aligned width): never read, and
// their gradient is 0. C = W when nothing is padded.
// cross_entropy_forward: per row i with label y = labels[i] (already validated: ignore_index
//   or in [0, C)):
//     lse[i]  = log Σ_c exp(x[i, c])
//     loss[i] = (1 - ε)(lse[i] - x[i, y]) + ε (lse[i] - mean_c x[i, c]),  0 when y == ignore_index.
//   logits: (N, W) floating   labels: (N,) i32/i64   loss: (N,) f32   lse: (N,) f32
// cross_entropy_backward: grad[i, c] = (exp(x[i, c] - lse[i]) - ε / C - (1 - ε)[c == y]) · row_scale[i]
//   for c < C, 0 past C and in ignored rows. lse, row_scale: (N,) f32; grad: (N, W) in the
//   logits' dtype.
// cross_entropy_total: out (a scalar, f32) = Σ_i loss[i] (summed in double), divided by count
//   (an i64 scalar on the device) when `mean` (NaN when count is 0: every target ignored, as
//   PyTorch).
// cross_entropy_count: count (an i64 scalar) = the labels that are not ignore_index, on the
//   device, so the mean needs no host read of the labels. The labels were validated first
//   (ops/index_checks.h), so every other label is in [0, C).
#define MT_LOSS_KERNELS                                                                                   \
  void cross_entropy_forward(const Array& logits, const Array& labels, int64_t classes, int64_t ignore_index, \
                             float smoothing, Array& loss, Array& lse);                                      \
  void cross_entropy_backward(const Array& logits, const Array& labels, int64_t classes, const Array& lse,     \
                              const Array& row_scale, int64_t ignore_index, float smoothing, Array& grad);   \
  void cross_entropy_total(const Array& loss, const Array& count, bool mean, Array& out);                  \
  void cross_entropy_count(const Array& labels, int64_t ignore_index, Array& count);

namespace mt::cpu { MT_LOSS_KERNELS }
namespace mt::cuda { MT_LOSS_KERNELS }
