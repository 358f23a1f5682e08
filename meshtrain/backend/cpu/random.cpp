#include "meshtrain/backend/random.h"

#include <algorithm>

#include "meshtrain/backend/cpu/fast_math.h"
#include "meshtrain/core/element.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

using kernels::StreamBlock;
using kernels::keep_threshold;

namespace {

// Elements per chunk: the most a for_each_chunk callback receives.
constexpr int64_t kChunk = 4096;

// Runs fn(local_start, n, uniforms_or_normals) over chunks of the array in parallel. Each
// local element i takes stream element g(i), its global flat index: chunk boundaries and
// sharding change no value because every element depends only on its global position.
template <bool kNormal, class Fn>
void for_each_chunk(const RngKey& unresolved, const Shape& local, const StreamBlock& block, Fn&& fn) {
  const RngKey key = unresolved.resolved();  // its last fold read once, before the threads
  const int64_t total = local.numel();
  // Runs of consecutive global indices: the whole array, or one per row of the block.
  int64_t run_len = total, runs = total > 0 ? 1 : 0;
  const bool blocked = !block.global_dims.empty() && local.ndim() > 0;
  if (blocked) {
    run_len = local.dim(-1);
    runs = run_len > 0 ? total / run_len : 0;
  }
  auto global_start = [&](int64_t run) -> int64_t {
    return blocked ? kernels::row_stream_start(local, block, run) : 0;
  };
  const int64_t chunks_per_run = (run_len + kChunk - 1) / kChunk;
  const int64_t work = runs * chunks_per_run;
#pragma omp parallel for if (total > grain::compute) schedule(static)
  for (int64_t w = 0; w < work; ++w) {
    float buf[kChunk];
    const int64_t run = w / chunks_per_run, c = w % chunks_per_run;
    const int64_t within = c * kChunk, n = std::min(kChunk, run_len - within);
    const int64_t gstart = global_start(run) + within;
    if constexpr (kNormal)
      fill_normal(key, uint64_t(gstart), n, buf);
    else
      fill_uniform(key, uint64_t(gstart), n, buf);
    fn(run * run_len + within, n, buf);
  }
}

}  // namespace

void random_uniform(const RngKey& key, Array& out, double lo, double hi, const StreamBlock& block) {
  dispatch_float(out.dtype(), "random_uniform", [&](auto tag) {
    using T = decltype(tag);
    T* po = out.data<T>();
    const float flo = float(lo), width = float(hi - lo);
    for_each_chunk<false>(key, out.shape(), block, [&](int64_t start, int64_t n, const float* u) {
      for (int64_t j = 0; j < n; ++j) po[start + j] = store_f32<T>(flo + width * u[j]);
    });
  });
}

void random_normal(const RngKey& key, Array& out, double mean, double std, const StreamBlock& block) {
  dispatch_float(out.dtype(), "random_normal", [&](auto tag) {
    using T = decltype(tag);
    T* po = out.data<T>();
    const float fm = float(mean), fs = float(std);
    for_each_chunk<true>(key, out.shape(), block, [&](int64_t start, int64_t n, const float* z) {
      for (int64_t j = 0; j < n; ++j) po[start + j] = store_f32<T>(fm + fs * z[j]);
    });
  });
}

void bernoulli(const RngKey& key, Array& out, double p, const StreamBlock& block) {
  bool* po = out.data<bool>();
  for_each_chunk<false>(key, out.shape(), block, [&](int64_t start, int64_t n, const float* u) {
    for (int64_t j = 0; j < n; ++j) po[start + j] = double(u[j]) < p;
  });
}

void dropout(const Array& x, Array& out, const RngKey& key, double rate, const StreamBlock& block) {
  dispatch_float(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    const float scale = rate < 1.0 ? float(1.0 / (1.0 - rate)) : 0.0f, threshold = keep_threshold(rate);
    for_each_chunk<false>(key, x.shape(), block, [&](int64_t start, int64_t n, const float* u) {
      const T* xs = px + start;
      T* os = po + start;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float kept = load_f32(xs[j]) * scale;  // a dropped inf or NaN still gives 0
        os[j] = store_f32<T>(u[j] >= threshold ? kept : 0.0f);
      }
    });
  });
}

void dropout_add(const Array& x, const Array& branch, Array& out, const RngKey& key, double rate,
                 const StreamBlock& block) {
  dispatch_float(x.dtype(), "add_dropout", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pb = branch.data<T>();
    T* po = out.data<T>();
    const float scale = rate < 1.0 ? float(1.0 / (1.0 - rate)) : 0.0f, threshold = keep_threshold(rate);
    for_each_chunk<false>(key, branch.shape(), block, [&](int64_t start, int64_t n, const float* u) {
      const T* xs = px + start;
      const T* bs = pb + start;
      T* os = po + start;
      // Rounded as the composed x + dropout(branch): the dropped term first (its own loop, so
      // the compiler cannot contract the product and the sum into one FMA), then the sum.
      float dropped[kChunk];
      // The branch is read whether kept or not (no read under the condition, which keeps
      // 16-bit loops scalar).
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float kept = load_f32(bs[j]) * scale;
        dropped[j] = round_to_f32<T>(u[j] >= threshold ? kept : 0.0f);
      }
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) os[j] = store_f32<T>(load_f32(xs[j]) + dropped[j]);
    });
  });
}

}  // namespace mt::cpu
