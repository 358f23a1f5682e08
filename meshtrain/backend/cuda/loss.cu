// Fused softmax cross-entropy over the last axis, one block per row, with the CPU kernel's
// formulas (cpu/loss.cpp): log-sum-exp in double from f32 exponentials, label smoothing,
// ignored rows 0. Labels were validated by the caller.
#include <algorithm>
#include <cstring>
#include <limits>

#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/elementwise.h"
#include "meshtrain/backend/loss.h"
#include "meshtrain/backend/reduce.h"

namespace mt::cuda {

namespace {

// f(k, value) for each of the first c elements of a row that this thread takes (threads stride
// by blockDim.x): 16-byte loads over whole vectors when rows start 16-byte aligned, single
// loads otherwise and for the tail. A row of GPT-2's logits is 50,304 bf16 values: single
// 2-byte loads made the two passes over it latency-bound.
template <class T, class F>
__device__ inline void for_row(const T* row, int64_t c, bool vector, F&& f) {
  constexpr int kW = kVecElems<T>;
  int64_t k0 = 0;
  if (vector) {
    const int64_t vecs = c / kW;
    for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) {
      const uint4 u = reinterpret_cast<const uint4*>(row)[v];
      T e[kW];
      memcpy(e, &u, sizeof(u));
#pragma unroll
      for (int q = 0; q < kW; ++q) f(v * kW + q, to_f32(e[q]));
    }
    k0 = vecs * kW;
  }
  for (int64_t k = k0 + threadIdx.x; k < c; k += blockDim.x) f(k, to_f32(row[k]));
}

template <class T, class I>
__global__ void cross_entropy_forward_kernel(const T* x, const I* labels, int64_t ignore_index, float smoothing,
                                             float* loss, float* lse, int64_t c, int64_t w, bool vector) {
  __shared__ float fshared[32];
  __shared__ double dshared[32];
  const int64_t i = blockIdx.x;
  const T* row = x + i * w;
  float m = -INFINITY;
  for_row(row, c, vector, [&](int64_t, float v) { m = fmaxf(m, v); });
  m = block_max(m, fshared);
  double s = 0, sx = 0;
  if (smoothing > 0.0f) {
    for_row(row, c, vector, [&](int64_t, float v) {
      s += double(expf(v - m));
      sx += double(v);
    });
  } else {
    for_row(row, c, vector, [&](int64_t, float v) { s += double(expf(v - m)); });
  }
  s = block_sum(s, dshared);
  if (smoothing > 0.0f) sx = block_sum(sx, dshared);
  if (threadIdx.x != 0) return;
  const double l = double(m) + ::log(s);
  lse[i] = float(l);
  const int64_t y = int64_t(labels[i]);
  if (y == ignore_index) {
    loss[i] = 0.0f;
    return;
  }
  const double nll = l - double(to_f32(row[y]));
  const double smooth = smoothing > 0.0f ? l - sx / double(c) : 0.0;
  loss[i] = float((1.0 - smoothing) * nll + (smoothing > 0.0f ? smoothing * smooth : 0.0));
}

// Rows on the grid's y axis (strided past 65,535), each row's columns on x, kVecElems per
// thread with 16-byte loads and stores where rows are aligned: no 64-bit division per element
// to find its row, which the flat loop paid on every one of a step's 824 M logits.
template <class T, class I>
__global__ void cross_entropy_backward_kernel(const T* x, const I* labels, const float* lse, const float* row_scale,
                                              int64_t ignore_index, float smoothing, T* grad, int64_t n, int64_t c,
                                              int64_t w, bool vector) {
  constexpr int kW = kVecElems<T>;
  const float off = smoothing / float(c), hit = 1.0f - smoothing;
  const int64_t k0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kW;
  if (k0 >= w) return;
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const int64_t y = int64_t(labels[i]);
    const bool ignored = y == ignore_index;
    const float row_lse = lse[i], scale = row_scale[i];
    const T* in = x + i * w + k0;
    T* out = grad + i * w + k0;
    auto grad_of = [&](int64_t k, float v) {
      if (ignored || k >= c) return 0.0f;  // an ignored row, or padding past the classes
      float d = expf(v - row_lse) - off;
      if (k == y) d -= hit;
      return d * scale;
    };
    if (vector && k0 + kW <= w) {
      const uint4 u = *reinterpret_cast<const uint4*>(in);
      T e[kW];
      memcpy(e, &u, sizeof(u));
#pragma unroll
      for (int q = 0; q < kW; ++q) e[q] = from_f32<T>(grad_of(k0 + q, to_f32(e[q])));
      uint4 o;
      memcpy(&o, e, sizeof(o));
      *reinterpret_cast<uint4*>(out) = o;
    } else {
      for (int q = 0; q < kW && k0 + q < w; ++q) out[q] = from_f32<T>(grad_of(k0 + q, to_f32(in[q])));
    }
  }
}

// Rows of width w start 16-byte aligned: w is a whole number of vectors and the array starts
// aligned (the loss kernels' 16-byte loads are then legal on every row).
template <class T>
bool aligned_rows(const void* base, int64_t w) {
  return w % kVecElems<T> == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
}

// The mean divided in double and rounded once, as the CPU's (whose sum stays in double
// throughout; here it arrives rounded to f32 from the reduction).
__global__ void mean_by_count_kernel(const float* total, const int64_t* count, float* out) {
  out[0] = *count > 0 ? float(double(total[0]) / double(*count)) : __int_as_float(0x7fc00000);
}

// Each thread counts its share and each warp sums its lanes' counts before one atomic add: an
// atomic per label serialized every add of a step's labels on one address. (Every lane reaches
// the shuffles: the grid loop has no early exit, and the block size is a multiple of 32.)
template <class I>
__global__ void count_labels_kernel(const I* labels, int64_t n, int64_t ignore_index, int64_t* count) {
  unsigned long long mine = 0;
  MT_GRID_LOOP(j, n) {
    if (int64_t(labels[j]) != ignore_index) ++mine;
  }
  for (int offset = 16; offset > 0; offset /= 2) mine += __shfl_down_sync(0xffffffffu, mine, offset);
  if ((threadIdx.x & 31) == 0 && mine != 0) atomicAdd(reinterpret_cast<unsigned long long*>(count), mine);
}

template <class F>
void dispatch_labels(const Array& labels, F&& f) {
  if (labels.dtype() == DType::i32) f(int32_t{});
  else if (labels.dtype() == DType::i64) f(int64_t{});
  else throw Error(detail::concat("[cross_entropy] labels must be i32 or i64, got ", labels.str()));
}

}  // namespace

void cross_entropy_forward(const Array& logits, const Array& labels, int64_t classes, int64_t ignore_index,
                           float smoothing, Array& loss, Array& lse) {
  const int64_t w = logits.shape()[logits.ndim() - 1], c = classes;  // row width, classes (c <= w)
  const int64_t n = w == 0 ? 0 : logits.numel() / w;
  if (n == 0) return;
  dispatch_device_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    dispatch_labels(labels, [&](auto itag) {
      using I = decltype(itag);
      cross_entropy_forward_kernel<<<unsigned(n), c <= 128 ? 128 : 512, 0, stream()>>>(
          ptr<T>(logits), ptr<I>(labels), ignore_index, smoothing, mptr<float>(loss), mptr<float>(lse), c, w,
          aligned_rows<T>(logits.raw(), w));
    });
  });
  check_launch("cross_entropy");
}

void cross_entropy_backward(const Array& logits, const Array& labels, int64_t classes, const Array& lse,
                            const Array& row_scale, int64_t ignore_index, float smoothing, Array& grad) {
  const int64_t w = logits.shape()[logits.ndim() - 1], c = classes;  // row width, classes (c <= w)
  const int64_t n = w == 0 ? 0 : logits.numel() / w;
  if (n == 0) return;
  dispatch_device_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    dispatch_labels(labels, [&](auto itag) {
      using I = decltype(itag);
      const bool vector = aligned_rows<T>(logits.raw(), w) && aligned_rows<T>(grad.raw(), w);
      const int64_t per_block = int64_t(kThreads) * kVecElems<T>;
      const dim3 grid(unsigned((w + per_block - 1) / per_block), unsigned(std::min<int64_t>(n, 65535)));
      cross_entropy_backward_kernel<<<grid, kThreads, 0, stream()>>>(
          ptr<T>(logits), ptr<I>(labels), ptr<float>(lse), ptr<float>(row_scale), ignore_index, smoothing,
          mptr<T>(grad), n, c, w, vector);
    });
  });
  check_launch("cross_entropy_backward");
}

// The sum, then the mean by the count read on the device (mean_by_count_kernel).
void cross_entropy_total(const Array& loss, const Array& count, bool mean, Array& out) {
  if (!mean) return reduce(kernels::ReduceOp::sum, loss, out, 1, loss.numel(), 1);
  Array total = Array::empty(Shape{}, DType::f32);
  reduce(kernels::ReduceOp::sum, loss, total, 1, loss.numel(), 1);
  mean_by_count_kernel<<<1, 1, 0, stream()>>>(ptr<float>(total), ptr<int64_t>(count), mptr<float>(out));
  check_launch("cross_entropy");
}

void cross_entropy_count(const Array& labels, int64_t ignore_index, Array& count) {
  const int64_t zero = 0;
  fill_pattern(count.raw(), &zero, 8, 1);
  const int64_t n = labels.numel();
  if (n == 0) return;
  dispatch_labels(labels, [&](auto itag) {
    using I = decltype(itag);
    count_labels_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<I>(labels), n, ignore_index,
                                                                   mptr<int64_t>(count));
  });
  check_launch("cross_entropy");
}

}  // namespace mt::cuda
