#include "meshtrain/backend/cpu/optimizer_kernels.h"

#include <cmath>

#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

// Built with -ffp-contract=off: each product is rounded before its sum, as the composed ops
// (and torch) round them, so the fused step equals the composed one bit for bit.
void adam_moments(const Array& g, const Array& m, const Array& v, const AdamHyper& h, Array& out) {
  const int64_t n = g.numel();
  const float* gp = g.data<float>();
  const float* mp = m.data<float>();
  const float* vp = v.data<float>();
  float* mo = out.data<float>();
  float* vo = mo + n;
  const AdamHyper k = h;
#pragma omp parallel for if (n > grain::compute) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = gp[i];
    mo[i] = mp[i] * k.b1 + gi * k.one_minus_b1;
    vo[i] = vp[i] * k.b2 + (gi * gi) * k.one_minus_b2;
  }
}

void adam_direction(const Array& m, const Array& v, const Array* p, const AdamHyper& h, Array& out) {
  const int64_t n = m.numel();
  const float* mp = m.data<float>();
  const float* vp = v.data<float>();
  const float* pp = p ? p->data<float>() : nullptr;
  float* uo = out.data<float>();
  const AdamHyper k = h;
  const float neg_step = -k.step_size;
  if (pp) {
#pragma omp parallel for if (n > grain::compute) schedule(static)
    for (int64_t i = 0; i < n; ++i) uo[i] = (mp[i] / (std::sqrt(vp[i]) / k.sqrt_bc2 + k.eps)) * neg_step - pp[i] * k.decay;
  } else {
#pragma omp parallel for if (n > grain::compute) schedule(static)
    for (int64_t i = 0; i < n; ++i) uo[i] = (mp[i] / (std::sqrt(vp[i]) / k.sqrt_bc2 + k.eps)) * neg_step;
  }
}

}  // namespace mt::cpu
