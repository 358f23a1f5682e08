#pragma once
#include "meshtrain/core/array.h"

namespace mt::cpu {

// Fused layer norm (`center` = true) and RMS norm (`center` = false) over the last dim,
// with x viewed as (N, C):
//   layer norm: y = (x - mean) * rstd * weight + bias,  rstd = 1/sqrt(var + eps)
//   rms norm:   y = x * rstd * weight,                  rstd = 1/sqrt(mean(x^2) + eps)
// Statistics and arithmetic are f32 (sums in double) for every float dtype. weight/bias
// may be undefined (no affine) and may have another float dtype than x; y has x's dtype.
void norm_forward(bool center,
                  const Array& x,       // (N, C)
                  const Array& weight,  // (C,) or undefined
                  const Array& bias,    // (C,) or undefined; only with center
                  double eps,
                  Array& y,             // (N, C), x's dtype
                  Array& mean,          // (N,) f32 row means (0 for RMS norm), saved for the backward
                  Array& rstd);         // (N,) f32, saved for the backward

// First-order backward of norm_forward from the saved statistics. dweight/dbias are
// computed when non-null, summed over rows in a fixed chunk order (deterministic for any
// thread count). g must have x's dtype.
void norm_backward(bool center,
                   const Array& g,       // (N, C) cotangent of y
                   const Array& x,       // (N, C)
                   const Array& weight,  // (C,) or undefined
                   const Array& mean,    // (N,) f32; ignored when !center
                   const Array& rstd,    // (N,) f32
                   Array& dx,            // (N, C), x's dtype
                   Array* dweight,       // (C,) weight's dtype, or null
                   Array* dbias);        // (C,) bias's dtype, or null

}  // namespace mt::cpu
