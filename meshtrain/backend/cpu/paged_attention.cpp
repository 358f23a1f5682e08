#include "meshtrain/backend/paged_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "meshtrain/backend/cpu/fast_math.h"
#include "meshtrain/core/element.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

using kernels::PagedRows;

void paged_kv_write(Array& pool, const Array& kv, const std::vector<int64_t>& slots) {
  const int64_t b = kv.dim(0), heads = kv.dim(1), t = kv.dim(2), d = kv.dim(3), block = pool.dim(2);
  const size_t row_bytes = size_t(d) * dtype_size(kv.dtype());
  const char* src = static_cast<const char*>(kv.raw());
  char* dst = static_cast<char*>(pool.raw());
  for (int64_t i = 0; i < b; ++i)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < t; ++j) {
        const int64_t slot = slots[size_t(i * t + j)];
        const int64_t at = ((slot / block) * heads + h) * block + slot % block;
        std::memcpy(dst + size_t(at) * row_bytes, src + size_t((i * heads + h) * t + j) * row_bytes, row_bytes);
      }
}

namespace {

// One (row, query head): scores, then the softmax as the softmax kernel computes it (max,
// double sum of fast_exp, one f32 reciprocal), then the probability-weighted values.
template <class T>
void attend_row(const T* __restrict q, const T* k_pool, const T* v_pool, const int64_t* table, int64_t length,
                int64_t kv_head, int64_t kv_heads, int64_t block, int64_t d, float scale, T* __restrict out,
                float* __restrict scores, float* __restrict acc) {
  const auto position = [&](int64_t j) { return ((table[j / block] * kv_heads + kv_head) * block + j % block) * d; };
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < length; ++j) {
    const T* k = k_pool + position(j);
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < d; ++c) s += load_f32(q[c]) * load_f32(k[c]);
    scores[j] = s * scale;
    m = std::max(m, scores[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < length; ++j) {
    scores[j] = fast_exp(scores[j] - m);
    sum += scores[j];
  }
  const float inv = float(1.0 / sum);
  std::fill(acc, acc + d, 0.0f);
  for (int64_t j = 0; j < length; ++j) {
    const T* v = v_pool + position(j);
    const float p = scores[j] * inv;
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) acc[c] += p * load_f32(v[c]);
  }
  for (int64_t c = 0; c < d; ++c) out[c] = store_f32<T>(acc[c]);
}

}  // namespace

void paged_attention(const Array& q, const Array& k_pool, const Array& v_pool, const PagedRows& rows, float scale,
                     Array& out) {
  const int64_t b = q.dim(0), heads = q.dim(1), d = q.dim(3);
  const int64_t kv_heads = k_pool.dim(1), block = k_pool.dim(2), group = heads / kv_heads;
  int64_t longest = 0, work = 0;
  for (int64_t len : rows.lengths) longest = std::max(longest, len), work += len;
  dispatch_float(q.dtype(), "paged_attention", [&](auto tag) {
    using T = decltype(tag);
    const T* qp = q.data<T>();
    const T* kp = k_pool.data<T>();
    const T* vp = v_pool.data<T>();
    T* op = out.data<T>();
#pragma omp parallel if (work * heads * d * 2 > grain::compute)
    {
      std::vector<float> scores(static_cast<size_t>(std::max<int64_t>(longest, 1))), acc(static_cast<size_t>(d));
#pragma omp for schedule(static)
      for (int64_t bh = 0; bh < b * heads; ++bh) {
        const int64_t i = bh / heads, h = bh % heads;
        attend_row(qp + bh * d, kp, vp, rows.block_table.data() + i * rows.max_blocks, rows.lengths[size_t(i)],
                   h / group, kv_heads, block, d, scale, op + bh * d, scores.data(), acc.data());
      }
    }
  });
}

}  // namespace mt::cpu
