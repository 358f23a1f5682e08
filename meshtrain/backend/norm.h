#pragma once
// The normalization kernels: cpu/norm.cpp and cuda/norm.cu.
#include "meshtrain/backend/random.h"
#include "meshtrain/core/array.h"

namespace mt::kernels {

// A residual branch added, through dropout, to the rows a norm normalizes: the post-norm
// block's norm(x + dropout(branch)) in one pass each way. The mask is drawn at the branch's
// positions (uniform_at(key, i) >= rate, as the dropout kernel), so it is regenerated in the
// backward instead of stored.
struct DropoutBranch {
  Array input;  // forward: the branch (x's shape and dtype)
  Array sum;    // forward: receives x + dropout(input), the rows normalized (kept for the backward)
  Array grad;   // backward: receives dropout(dx), the branch's gradient
  RngKey key;
  double rate = 0;
  StreamBlock block;
};

}  // namespace mt::kernels

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
// With a DropoutBranch, the forward normalizes s = x + dropout(branch.input) (rounded to x's
//   dtype as the composed ops round it) and writes s to branch.sum; the backward takes s as
//   `x` and also writes branch.grad = dropout(dx).
#define MT_NORM_KERNELS                                                                                    \
  void norm_forward(bool center, const Array& x, const Array& weight, const Array& bias, double eps,        \
                    Array& y, Array& mean, Array& rstd, const kernels::DropoutBranch* branch = nullptr);    \
  void norm_backward(bool center, const Array& g, const Array& x, const Array& weight, const Array& mean,    \
                     const Array& rstd, Array& dx, Array* dweight, Array* dbias,                            \
                     const kernels::DropoutBranch* branch = nullptr);

namespace mt::cpu { MT_NORM_KERNELS }
namespace mt::cuda { MT_NORM_KERNELS }
