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

// Adam's moments for f32 arrays of one shape: [2, ...g.shape] = (m', v') with
// m' = b1·m + (1-b1)·g and v' = b2·v + (1-b2)·g², rounded as the composed ops and torch round.
// When m and v are rows 0 and 1 of an earlier result, moved in as the only handles to it,
// the new moments overwrite it (no second copy of the optimizer state during the update).
Array adam_moments(const Array& g, Array m, Array v, const AdamStep& step);
// The update from the new moments: -(m / (sqrt(v) / sqrt_bc2 + eps)) · step_size - decay · p.
Array adam_direction(const Array& m, const Array& v, const Array& p, const AdamStep& step);

// Multi-tensor forms: k parameters' moments and updates in one call each (a few kernel
// launches on the GPU instead of two per parameter), flat results in argument order.
// adam_moments_multi -> [2, total]: row 0 holds m'_0, m'_1, ... one after another, row 1 the
// v's. When m and v are the views of an earlier result in the same order (moved in as its only
// handles), it is overwritten in place. adam_direction_multi -> [total] updates; tensor j
// decays by decays[j] (0: p_j is not read).
Array adam_moments_multi(const std::vector<Array>& g, std::vector<Array> m, std::vector<Array> v,
                         const AdamStep& step);
Array adam_direction_multi(const std::vector<Array>& m, const std::vector<Array>& v, const std::vector<Array>& p,
                           const AdamStep& step, const std::vector<double>& decays);

}  // namespace mt
