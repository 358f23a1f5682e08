#pragma once
// Deterministic column sums over rows on the device, as the CPU kernels sum them: f64 partial
// sums per 64-row chunk, then over the chunks in order (the norms' weight and bias gradients,
// bias_activation's bias gradient).
#include "meshtrain/backend/cuda/device_types.cuh"

namespace mt::cuda {
namespace {

constexpr int64_t kRowChunk = 64;

// out[i] = Σ_ch part[ch, i] in chunk order; part: (chunks, C) f64.
template <class O>
__global__ void sum_chunks_kernel(const double* part, O* out, int64_t chunks, int64_t c) {
  MT_GRID_LOOP(i, c) {
    double s = 0;
    for (int64_t ch = 0; ch < chunks; ++ch) s += part[ch * c + i];
    out[i] = from_f32<O>(float(s));
  }
}

}  // namespace
}  // namespace mt::cuda
