// Softmax / log-softmax along R of (outer, R, inner), and the fused causal softmax of
// attention. As on the CPU: max-shifted, exponentials in f32, sums in double.
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/softmax.h"

namespace mt::cuda {

namespace {

// Threads for one block per row: enough to cover short rows without idle warps.
int row_threads(int64_t r) { return r <= 32 ? 32 : r <= 64 ? 64 : r <= 128 ? 128 : 256; }

// One row per block. `visible` entries (the causal prefix; r for a plain softmax) are
// normalized after scaling by `scale`; entries past it are written as 0.
template <class T>
__global__ void softmax_rows_kernel(const T* x, T* y, int64_t r, bool log, float scale, int64_t tq, int64_t tk,
                                    bool causal) {
  __shared__ float fshared[32];
  __shared__ double dshared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * r;
  T* yr = y + row * r;
  int64_t visible = r;
  if (causal) visible = min(r, row % tq + (tk - tq) + 1);
  float m = -INFINITY;
  for (int64_t k = threadIdx.x; k < visible; k += blockDim.x) m = fmaxf(m, to_f32(xr[k]) * scale);
  m = block_max(m, fshared);
  double s = 0;
  for (int64_t k = threadIdx.x; k < visible; k += blockDim.x) s += double(expf(to_f32(xr[k]) * scale - m));
  s = block_sum(s, dshared);
  if (log) {
    const float ls = float(::log(s));
    for (int64_t k = threadIdx.x; k < visible; k += blockDim.x) yr[k] = from_f32<T>((to_f32(xr[k]) * scale - m) - ls);
  } else {
    const float inv = float(1.0 / s);
    for (int64_t k = threadIdx.x; k < visible; k += blockDim.x) yr[k] = from_f32<T>(expf(to_f32(xr[k]) * scale - m) * inv);
  }
  for (int64_t k = visible + threadIdx.x; k < r; k += blockDim.x) yr[k] = from_f32<T>(0.0f);
}

// inner > 1: one thread per (outer, inner) column, three passes along R.
template <class T>
__global__ void softmax_columns_kernel(const T* x, T* y, int64_t outer, int64_t r, int64_t inner, bool log) {
  MT_GRID_LOOP(c, outer * inner) {
    const int64_t o = c / inner, i = c % inner;
    const T* xc = x + o * r * inner + i;
    T* yc = y + o * r * inner + i;
    float m = -INFINITY;
    for (int64_t k = 0; k < r; ++k) m = fmaxf(m, to_f32(xc[k * inner]));
    double s = 0;
    for (int64_t k = 0; k < r; ++k) s += double(expf(to_f32(xc[k * inner]) - m));
    const float sc = float(log ? ::log(s) : 1.0 / s);
    for (int64_t k = 0; k < r; ++k) {
      const float v = to_f32(xc[k * inner]) - m;
      yc[k * inner] = from_f32<T>(log ? v - sc : expf(v) * sc);
    }
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* y, const T* g, T* dx, int64_t r, float scale) {
  __shared__ double shared[32];
  const int64_t row = blockIdx.x;
  const T* yr = y + row * r;
  const T* gr = g + row * r;
  double dot = 0;
  for (int64_t k = threadIdx.x; k < r; k += blockDim.x) dot += double(to_f32(gr[k]) * to_f32(yr[k]));
  const float d = float(block_sum(dot, shared));
  T* out = dx + row * r;
  for (int64_t k = threadIdx.x; k < r; k += blockDim.x) out[k] = from_f32<T>(to_f32(yr[k]) * (to_f32(gr[k]) - d) * scale);
}

}  // namespace

void softmax_backward(const Array& y, const Array& g, Array& dx, int64_t rows, int64_t r, float scale) {
  if (rows * r == 0) return;
  dispatch_device_float(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    softmax_backward_kernel<<<unsigned(rows), row_threads(r), 0, stream()>>>(ptr<T>(y), ptr<T>(g), mptr<T>(dx), r,
                                                                             scale);
  });
  check_launch("softmax_backward");
}

void softmax_forward(const Array& x, Array& y, int64_t outer, int64_t r, int64_t inner, bool log) {
  if (outer * r * inner == 0) return;
  dispatch_device_float(x.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    if (inner == 1)
      softmax_rows_kernel<<<unsigned(outer), row_threads(r), 0, stream()>>>(ptr<T>(x), mptr<T>(y), r, log, 1.0f, 1, 1,
                                                                            false);
    else
      softmax_columns_kernel<<<blocks_for(outer * inner), kThreads, 0, stream()>>>(ptr<T>(x), mptr<T>(y), outer, r,
                                                                                   inner, log);
  });
  check_launch("softmax");
}

void causal_softmax_forward(const Array& x, Array& y, int64_t blocks, int64_t tq, int64_t tk, float scale) {
  if (blocks * tq * tk == 0) return;
  dispatch_device_float(x.dtype(), "causal_softmax", [&](auto tag) {
    using T = decltype(tag);
    softmax_rows_kernel<<<unsigned(blocks * tq), row_threads(tk), 0, stream()>>>(ptr<T>(x), mptr<T>(y), tk, false,
                                                                                 scale, tq, tk, true);
  });
  check_launch("causal_softmax");
}

}  // namespace mt::cuda
