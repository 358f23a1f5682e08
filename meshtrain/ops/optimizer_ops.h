#pragma once
// Optimizer steps as fused primitives: a few memory passes per parameter instead of one per
// elementwise op (optim::adam uses them for f32 parameters that are not distributed).
#include <vector>

#include "meshtrain/core/array.h"

namespace mt {

struct AdamStep {
  double b1 = 0.9, b2 = 0.999;
  double step_size = 0;  // lr / (1 - b1^t)
  double sqrt_bc2 = 1;   // sqrt(1 - b2^t)
  double eps = 1e-8;
  double decay = 0;      // lr · weight_decay, applied to p (AdamW); 0: p is not read
};

// The values of `step` that change from step to step (step size, bias correction, decay), as
// the direction kernels read them: f32 [3] on `device`. The AdamW transform keeps one and
// rewrites it before each step (write_adam_step_scalars), so no launch of its step carries a
// per-step value and a captured step replays with the current learning rate.
Array adam_step_scalars(const AdamStep& step, Device device);
void write_adam_step_scalars(const Array& scalars, const AdamStep& step);

// Adam's moments for f32 arrays of one shape: [2, ...g.shape] = (m', v') with
// m' = b1·m + (1-b1)·g and v' = b2·v + (1-b2)·g², rounded as the composed ops and torch round.
// When m and v are rows 0 and 1 of an earlier result, moved in as the only handles to it,
// the new moments overwrite it (no second copy of the optimizer state during the update).
Array adam_moments(const Array& g, Array m, Array v, const AdamStep& step);
// The update from the new moments: -(m / (sqrt(v) / sqrt_bc2 + eps)) · step_size - decay · p,
// with step_size, sqrt_bc2 and decay read from `scalars` (adam_step_scalars; the second form
// makes them from `step`).
Array adam_direction(const Array& m, const Array& v, const Array& p, const AdamStep& step, const Array& scalars);
Array adam_direction(const Array& m, const Array& v, const Array& p, const AdamStep& step);

// Multi-tensor forms: k parameters' moments and updates in one call each (a few kernel
// launches on the GPU instead of two per parameter), flat results in argument order.
// adam_moments_multi -> [2, total]: row 0 holds m'_0, m'_1, ... one after another, row 1 the
// v's. When m and v are the views of an earlier result in the same order (moved in as its only
// handles), it is overwritten in place. adam_direction_multi -> [total] updates, the step's
// values read from `scalars`; tensor j decays (by the scalars' decay) where decays[j], and
// p_j is read only there.
Array adam_moments_multi(const std::vector<Array>& g, std::vector<Array> m, std::vector<Array> v,
                         const AdamStep& step);
Array adam_direction_multi(const std::vector<Array>& m, const std::vector<Array>& v, const std::vector<Array>& p,
                           const AdamStep& step, const std::vector<bool>& decays, const Array& scalars);
// The same updates, each written over its gradient's buffer where the gradients are moved in
// as the only handles to them (f32, the tensor's shape): the step allocates nothing. Others
// get new buffers. Returns the k updates.
std::vector<Array> adam_direction_multi_into(std::vector<Array> gradients, const std::vector<Array>& m,
                                             const std::vector<Array>& v, const std::vector<Array>& p,
                                             const AdamStep& step, const std::vector<bool>& decays,
                                             const Array& scalars);

// Gradient clipping over a whole tree (optim::clip_by_global_norm), a pass each where the
// composed ops took three or four small ops per tensor (a few hundred launches per step on the
// GPU for GPT-2):
// the sum of the squares of every element of `xs` (floating arrays of one dtype on one device,
// none distributed), an f32 scalar: each square rounded to f32, summed in f64 in a fixed order
// (see backend/optimizer.h), so it equals sum(square(cast(x, f32))) summed over x to within
// f64 rounding, whatever the thread count. Its gradient is 2·x·g.
Array sum_of_squares_multi(const std::vector<Array>& xs);
// xs[j] · scale for each j (floating arrays of one dtype on one device; `scale` an f32 array of
// one element there, read on the device), the product in f32 rounded to the arrays' dtype. An
// array moved in as the only handle to its buffer is scaled in place; the others get new
// buffers. Not differentiable.
std::vector<Array> scale_multi_into(std::vector<Array> xs, const Array& scale);
// a[j] + b[j] for each j (floating arrays of one dtype on one device, b[j] of a[j]'s shape), the
// sum in f32 rounded to the dtype: optim::apply_updates' pass. a[j] moved in as the only handle
// to its buffer is updated in place; the others get new buffers. Not differentiable.
std::vector<Array> add_multi_into(std::vector<Array> a, const std::vector<Array>& b);
// xs[j] in `dtype` for each j (floating arrays of one dtype on one device; `dtype` floating),
// rounded as cast rounds, in new arrays: mixed precision's casts of the master weights, one
// pass and a launch or two on the GPU. Distributed xs[j] are gathered first, as the other
// multi-tensor ops do (the precision policy casts those with cast, which keeps their layout).
// Not differentiable (the policy casts without a tape and reads the casts through precast).
std::vector<Array> cast_multi(const std::vector<Array>& xs, DType dtype);

}  // namespace mt
