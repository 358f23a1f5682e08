// The rotary embedding on the GPU, one thread per pair, with the CPU's rounding: the
// products and sums go through __fmul_rn / __fadd_rn / __fsub_rn, which are never contracted
// into FMAs, and each is rounded to x's dtype as the composed ops round it.
#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/rotary.h"

namespace mt::cuda {

namespace {

template <class T>
__device__ inline float rounded(float v) {
  return to_f32(from_f32<T>(v));
}

template <class T>
__global__ void rotary_kernel(const T* x, const T* cos, const T* sin, T* out, int64_t pairs, kernels::RotaryShape s) {
  const int64_t half = s.d / 2;
  MT_GRID_LOOP(e, pairs) {
    const int64_t r = e / half, i = e % half;
    const int64_t o = r / (s.t * s.inner), t = (r / s.inner) % s.t;
    const int64_t table = ((s.per_batch ? (o / s.outer_per_batch) * s.t : 0) + t) * half + i;
    const int64_t ia = r * s.d + (s.interleaved ? 2 * i : i), ib = r * s.d + (s.interleaved ? 2 * i + 1 : i + half);
    const float a = to_f32(x[ia]), b = to_f32(x[ib]), c = to_f32(cos[table]);
    const float sn = s.inverse ? -to_f32(sin[table]) : to_f32(sin[table]);
    // The backward adds +0 (no negative zeros), as the composed one does; x + -0 is x.
    const float zero_sum = s.inverse ? 0.0f : -0.0f;
    out[ia] = from_f32<T>(__fadd_rn(__fsub_rn(rounded<T>(__fmul_rn(a, c)), rounded<T>(__fmul_rn(b, sn))), zero_sum));
    out[ib] = from_f32<T>(__fadd_rn(__fadd_rn(rounded<T>(__fmul_rn(b, c)), rounded<T>(__fmul_rn(a, sn))), zero_sum));
  }
}

}  // namespace

void rotary(const Array& x, const Array& cos, const Array& sin, const kernels::RotaryShape& s, Array& out) {
  const int64_t pairs = s.outer * s.t * s.inner * (s.d / 2);
  if (pairs == 0) return;
  dispatch_device_float(x.dtype(), "rotary", [&](auto tag) {
    using T = decltype(tag);
    rotary_kernel<T><<<blocks_for(pairs), kThreads, 0, stream()>>>(ptr<T>(x), ptr<T>(cos), ptr<T>(sin), mptr<T>(out),
                                                                   pairs, s);
  });
  check_launch("rotary");
}

}  // namespace mt::cuda
