#pragma once
// The normalization kernels: cpu/norm.cpp and cuda/norm.cu.
#include "meshtrain/core/array.h"

// norm_forward: fused layer norm (`center` = true) and RMS norm (`center` = false) over the
//   last dim, with x viewed as (N, C):
//     layer norm: y = (x - mean) * rstd * weight + bias,  rstd = 1/sqrt(var + eps)
//     rms norm:   y = x * rstd * weight,                  rstd = 1/sqrt(mean(x^2) + eps)
//   weight (C,) and bias (C,) may be undefined (no affine; bias only with center) and may have
//   another float dtype than x. Statistics and arithmetic are f32 (sums in double) for every
//   float dtype. y (N, C) has x's dtype; mean (N,) f32 (0 for RMS norm) and rstd (N,) f32 are
//   saved for the backward.
// norm_backward: the first-order backward from the saved statistics; g (the cotangent of y)
//   has x's dtype; dx has x's. dweight/dbias (C,) in weight's/bias's dtype are computed when
//   non-null, summed over rows in a fixed chunk order (deterministic for any thread count).
//   mean is ignored when !center.
#define MT_NORM_KERNELS                                                                                  \
  void norm_forward(bool center, const Array& x, const Array& weight, const Array& bias, double eps,      \
                    Array& y, Array& mean, Array& rstd);                                                  \
  void norm_backward(bool center, const Array& g, const Array& x, const Array& weight, const Array& mean,  \
                     const Array& rstd, Array& dx, Array* dweight, Array* dbias);

namespace mt::cpu { MT_NORM_KERNELS }
namespace mt::cuda { MT_NORM_KERNELS }
