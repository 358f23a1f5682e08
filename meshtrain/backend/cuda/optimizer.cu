// Adam/AdamW updates in two passes, with the CPU kernel's order of operations (this file is
// compiled without FMA contraction, as optimizer_kernels.cpp is, so both round alike).
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/cuda/kernels.h"

namespace mt::cuda {

namespace {

__global__ void adam_moments_kernel(const float* g, const float* m, const float* v, cpu::AdamHyper k, float* mo,
                                    float* vo, int64_t n) {
  MT_GRID_LOOP(i, n) {
    const float gi = g[i];
    mo[i] = m[i] * k.b1 + gi * k.one_minus_b1;
    vo[i] = v[i] * k.b2 + (gi * gi) * k.one_minus_b2;
  }
}

__global__ void adam_direction_kernel(const float* m, const float* v, const float* p, cpu::AdamHyper k, float* out,
                                      int64_t n) {
  const float neg_step = -k.step_size;
  MT_GRID_LOOP(i, n) {
    float u = (m[i] / (sqrtf(v[i]) / k.sqrt_bc2 + k.eps)) * neg_step;
    if (p) u = u - p[i] * k.decay;
    out[i] = u;
  }
}

}  // namespace

void adam_moments(const Array& g, const Array& m, const Array& v, const cpu::AdamHyper& h, Array& out) {
  const int64_t n = g.numel();
  if (n == 0) return;
  float* mo = mptr<float>(out);
  adam_moments_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<float>(g), ptr<float>(m), ptr<float>(v), h, mo,
                                                                mo + n, n);
  check_launch("adam_moments");
}

void adam_direction(const Array& m, const Array& v, const Array* p, const cpu::AdamHyper& h, Array& out) {
  const int64_t n = m.numel();
  if (n == 0) return;
  adam_direction_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<float>(m), ptr<float>(v),
                                                                  p ? ptr<float>(*p) : nullptr, h, mptr<float>(out), n);
  check_launch("adam_direction");
}

}  // namespace mt::cuda
