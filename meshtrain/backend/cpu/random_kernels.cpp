#include "meshtrain/backend/cpu/random_kernels.h"

#include <algorithm>

#include "meshtrain/core/element.h"

namespace mt::cpu {

namespace {

// Runs fn(offset, n, uniforms_or_normals) over chunks of the stream in parallel; chunk
// boundaries do not change any value because every element depends only on its index.
template <bool kNormal, class Fn>
void for_each_chunk(const RngKey& key, int64_t total, Fn&& fn) {
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (total + kChunk - 1) / kChunk;
#pragma omp parallel for if (total > 32768) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    float buf[kChunk];
    const int64_t start = c * kChunk, n = std::min(kChunk, total - start);
    if constexpr (kNormal)
      fill_normal(key, uint64_t(start), n, buf);
    else
      fill_uniform(key, uint64_t(start), n, buf);
    fn(start, n, buf);
  }
}

}  // namespace

void random_uniform(const RngKey& key, Array& out, double lo, double hi) {
  dispatch_float(out.dtype(), "random_uniform", [&](auto tag) {
    using T = decltype(tag);
    T* po = out.data<T>();
    const float flo = float(lo), width = float(hi - lo);
    for_each_chunk<false>(key, out.numel(), [&](int64_t start, int64_t n, const float* u) {
      for (int64_t j = 0; j < n; ++j) po[start + j] = store_f32<T>(flo + width * u[j]);
    });
  });
}

void random_normal(const RngKey& key, Array& out, double mean, double std) {
  dispatch_float(out.dtype(), "random_normal", [&](auto tag) {
    using T = decltype(tag);
    T* po = out.data<T>();
    const float fm = float(mean), fs = float(std);
    for_each_chunk<true>(key, out.numel(), [&](int64_t start, int64_t n, const float* z) {
      for (int64_t j = 0; j < n; ++j) po[start + j] = store_f32<T>(fm + fs * z[j]);
    });
  });
}

void bernoulli(const RngKey& key, Array& out, double p) {
  bool* po = out.data<bool>();
  for_each_chunk<false>(key, out.numel(), [&](int64_t start, int64_t n, const float* u) {
    for (int64_t j = 0; j < n; ++j) po[start + j] = double(u[j]) < p;
  });
}

void dropout(const Array& x, Array& out, const RngKey& key, double rate) {
  dispatch_float(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    const float scale = rate < 1.0 ? float(1.0 / (1.0 - rate)) : 0.0f;
    for_each_chunk<false>(key, x.numel(), [&](int64_t start, int64_t n, const float* u) {
      for (int64_t j = 0; j < n; ++j)
        po[start + j] = double(u[j]) >= rate ? store_f32<T>(load_f32(px[start + j]) * scale) : store_f32<T>(0.0f);
    });
  });
}

}  // namespace mt::cpu
