#include "meshtrain/backend/cpu/fast_math.h"
#include "meshtrain/backend/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "meshtrain/core/element.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();


// One contiguous row of length r (the inner == 1 case: softmax over the last axis). The
// loops are written to vectorize (restrict, lane-wise f32 sums) when the compiler's cost
// model allows it.
template <class T>
void softmax_row(const T* __restrict x,  // (R,)
                 T* __restrict y,        // (R,)
                 int64_t r, bool log, float* __restrict scratch) {
  float m = kNegInf;
#pragma omp simd reduction(max : m)
  for (int64_t k = 0; k < r; ++k) m = std::max(m, load_f32(x[k]));
  // A NaN anywhere poisons the row through exp(NaN - m), as in torch. Sums in double:
  // vocabulary-sized rows would otherwise lose digits.
  double s = 0;
  if (log) {
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < r; ++k) s += fast_exp(load_f32(x[k]) - m);
    // (x - m) - log s rather than x - (m + log s): the first difference is exact near the
    // max, so large-magnitude logits keep full precision.
    const float ls = float(std::log(s));
#pragma omp simd
    for (int64_t k = 0; k < r; ++k) y[k] = store_f32<T>((load_f32(x[k]) - m) - ls);
    return;
  }
  // The exponentials stay in f32 until normalized, so bf16 rounds only once.
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < r; ++k) {
    scratch[k] = fast_exp(load_f32(x[k]) - m);
    s += scratch[k];
  }
  const float inv = float(1.0 / s);
#pragma omp simd
  for (int64_t k = 0; k < r; ++k) y[k] = store_f32<T>(scratch[k] * inv);
}

// Columns [i0, i1) of one outer slice when the reduced axis is not the last: the inner
// index is contiguous, so each pass over R runs vectorizable loops over the columns.
template <class T>
void softmax_columns(const T* x,  // (R, inner) slice
                     T* y,        // (R, inner) slice
                     int64_t r, int64_t inner, int64_t i0, int64_t i1, bool log, std::vector<float>& mx,
                     std::vector<double>& sum, std::vector<float>& scale) {
  const int64_t w = i1 - i0;
  mx.assign(size_t(w), kNegInf);
  sum.assign(size_t(w), 0.0);
  scale.resize(size_t(w));
  for (int64_t k = 0; k < r; ++k) {
    const T* row = x + k * inner + i0;
    for (int64_t i = 0; i < w; ++i) mx[size_t(i)] = std::max(mx[size_t(i)], load_f32(row[i]));
  }
  for (int64_t k = 0; k < r; ++k) {
    const T* row = x + k * inner + i0;
    for (int64_t i = 0; i < w; ++i) sum[size_t(i)] += fast_exp(load_f32(row[i]) - mx[size_t(i)]);
  }
  // Per column: log of the sum (log_softmax) or its inverse (softmax).
  for (int64_t i = 0; i < w; ++i) scale[size_t(i)] = float(log ? std::log(sum[size_t(i)]) : 1.0 / sum[size_t(i)]);
  for (int64_t k = 0; k < r; ++k) {
    const T* row = x + k * inner + i0;
    T* out = y + k * inner + i0;
    for (int64_t i = 0; i < w; ++i) {
      const float v = load_f32(row[i]) - mx[size_t(i)];
      out[i] = store_f32<T>(log ? v - scale[size_t(i)] : fast_exp(v) * scale[size_t(i)]);
    }
  }
}

// The first n entries of one row, scaled, through softmax; the rest of the row zeroed.
template <class T>
void causal_softmax_row(const T* __restrict x, T* __restrict y, int64_t n, int64_t r, float scale,
                        float* __restrict scratch) {
  float m = kNegInf;
#pragma omp simd reduction(max : m)
  for (int64_t k = 0; k < n; ++k) m = std::max(m, load_f32(x[k]) * scale);
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < n; ++k) {
    scratch[k] = fast_exp(load_f32(x[k]) * scale - m);
    s += scratch[k];
  }
  const float inv = float(1.0 / s);
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) y[k] = store_f32<T>(scratch[k] * inv);
  for (int64_t k = n; k < r; ++k) y[k] = store_f32<T>(0.0f);
}

}  // namespace

void causal_softmax_forward(const Array& x, Array& y, int64_t blocks, int64_t tq, int64_t tk, float scale) {
  dispatch_float(x.dtype(), "causal_softmax", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t rows = blocks * tq;
#pragma omp parallel if (rows * tk > grain::row)
    {
      std::vector<float> scratch(static_cast<size_t>(tk));
#pragma omp for schedule(static)
      for (int64_t row = 0; row < rows; ++row) {
        const int64_t visible = std::min(tk, row % tq + (tk - tq) + 1);
        causal_softmax_row(px + row * tk, py + row * tk, visible, tk, scale, scratch.data());
      }
    }
  });
}

void softmax_backward(const Array& y, const Array& g, Array& dx, int64_t rows, int64_t r, float scale) {
  dispatch_float(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* py = y.data<T>();
    const T* pg = g.data<T>();
    T* pd = dx.data<T>();
#pragma omp parallel for if (rows * r > grain::row && rows > 1) schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const T* yr = py + row * r;
      const T* gr = pg + row * r;
      double dot = 0;
      for (int64_t k = 0; k < r; ++k) dot += double(load_f32(gr[k]) * load_f32(yr[k]));
      const float d = float(dot);
      T* out = pd + row * r;
      for (int64_t k = 0; k < r; ++k) out[k] = store_f32<T>(load_f32(yr[k]) * (load_f32(gr[k]) - d) * scale);
    }
  });
}

void softmax_forward(const Array& x, Array& y, int64_t outer, int64_t r, int64_t inner, bool log) {
  dispatch_float(x.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const bool parallel = outer * r * inner > grain::row;
    if (inner == 1) {
#pragma omp parallel if (parallel && outer > 1)
      {
        std::vector<float> scratch(static_cast<size_t>(r));
#pragma omp for schedule(static)
        for (int64_t o = 0; o < outer; ++o) softmax_row(px + o * r, py + o * r, r, log, scratch.data());
      }
      return;
    }
    // Blocks of columns bound the scratch size and give parallel work when outer is small.
    constexpr int64_t kBlock = 256;
    const int64_t blocks = (inner + kBlock - 1) / kBlock;
#pragma omp parallel if (parallel && outer * blocks > 1)
    {
      std::vector<float> mx, scale;
      std::vector<double> sum;
#pragma omp for schedule(static)
      for (int64_t t = 0; t < outer * blocks; ++t) {
        const int64_t o = t / blocks, b = t % blocks;
        const int64_t i0 = b * kBlock, i1 = std::min(inner, i0 + kBlock);
        softmax_columns(px + o * r * inner, py + o * r * inner, r, inner, i0, i1, log, mx, sum, scale);
      }
    }
  });
}

}  // namespace mt::cpu
