#include "meshtrain/backend/cpu/attention_kernel.h"

#include <cmath>
#include <vector>

#include "meshtrain/core/element.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

namespace {

// Loads (BH · T, D) rows of any float dtype as f32.
std::vector<float> as_f32(const Array& x) {
  std::vector<float> out(size_t(x.numel()));
  dispatch_float(x.dtype(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = load_f32(p[i]);
  });
  return out;
}

void store_from_f32(const std::vector<float>& v, Array& x) {
  dispatch_float(x.dtype(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    T* p = x.data<T>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = store_f32<T>(v[i]);
  });
}

int64_t visible_keys(const FlashAttentionShape& s, int64_t i) {
  return s.causal ? std::min(s.tk, i + (s.tk - s.tq) + 1) : s.tk;
}

// The dropout multiplier of probability (bh, i, j): 0, or 1 / (1 - rate) where kept.
float keep_factor(const FlashAttentionShape& s, int64_t bh, int64_t i, int64_t j) {
  if (s.dropout_rate <= 0) return 1.0f;
  const uint64_t idx = uint64_t((bh * s.tq + i) * s.tk + j);
  return double(uniform_at(s.dropout_key, idx)) >= s.dropout_rate ? float(1.0 / (1.0 - s.dropout_rate)) : 0.0f;
}

float dot(const float* a, const float* b, int64_t d) {
  float acc = 0;
  for (int64_t c = 0; c < d; ++c) acc += a[c] * b[c];
  return acc;
}

}  // namespace

void flash_attention_forward(const Array& q, const Array& k, const Array& v, const FlashAttentionShape& s, Array& out,
                             Array& lse) {
  const std::vector<float> qf = as_f32(q), kf = as_f32(k), vf = as_f32(v);
  std::vector<float> of(size_t(out.numel()), 0.0f);
  float* pl = lse.data<float>();
  const int64_t rows = s.batch_heads * s.tq, d = s.d;
#pragma omp parallel if (rows * s.tk * d > grain::compute)
  {
    std::vector<float> scores(size_t(s.tk));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t bh = row / s.tq, i = row % s.tq, n = visible_keys(s, i);
      const float* qi = qf.data() + row * d;
      float m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        scores[size_t(j)] = s.scale * dot(qi, kf.data() + (bh * s.tk + j) * d, d);
        m = std::max(m, scores[size_t(j)]);
      }
      double l = 0;
      for (int64_t j = 0; j < n; ++j) l += double(std::exp(scores[size_t(j)] - m));
      const float row_lse = m + float(std::log(l));
      pl[row] = row_lse;
      float* o = of.data() + row * d;
      for (int64_t j = 0; j < n; ++j) {
        const float p = std::exp(scores[size_t(j)] - row_lse) * keep_factor(s, bh, i, j);
        if (p == 0.0f) continue;
        const float* vj = vf.data() + (bh * s.tk + j) * d;
        for (int64_t c = 0; c < d; ++c) o[c] += p * vj[c];
      }
    }
  }
  store_from_f32(of, out);
}

void flash_attention_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                              const Array& g, const FlashAttentionShape& s, Array& dq, Array& dk, Array& dv) {
  const std::vector<float> qf = as_f32(q), kf = as_f32(k), vf = as_f32(v), of = as_f32(out), gf = as_f32(g);
  const float* pl = lse.data<float>();
  std::vector<float> dqf(qf.size(), 0.0f), dkf(kf.size(), 0.0f), dvf(vf.size(), 0.0f);
  const int64_t d = s.d;
  // Each (batch, head) is independent: one task owns its rows of dq, dk, dv.
#pragma omp parallel for if (s.batch_heads * s.tq * s.tk * d > grain::compute) schedule(static)
  for (int64_t bh = 0; bh < s.batch_heads; ++bh) {
    for (int64_t i = 0; i < s.tq; ++i) {
      const int64_t row = bh * s.tq + i, n = visible_keys(s, i);
      const float* qi = qf.data() + row * d;
      const float* gi = gf.data() + row * d;
      const float di = dot(gi, of.data() + row * d, d);  // Σ_j P_ij dP_ij = dO_i · O_i
      float* dqi = dqf.data() + row * d;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t krow = bh * s.tk + j;
        const float* kj = kf.data() + krow * d;
        const float* vj = vf.data() + krow * d;
        const float p = std::exp(s.scale * dot(qi, kj, d) - pl[row]);
        const float keep = keep_factor(s, bh, i, j);
        const float ds = p * (keep * dot(gi, vj, d) - di) * s.scale;
        float* dkj = dkf.data() + krow * d;
        float* dvj = dvf.data() + krow * d;
        for (int64_t c = 0; c < d; ++c) {
          dvj[c] += p * keep * gi[c];
          dqi[c] += ds * kj[c];
          dkj[c] += ds * qi[c];
        }
      }
    }
  }
  store_from_f32(dqf, dq);
  store_from_f32(dkf, dk);
  store_from_f32(dvf, dv);
}

}  // namespace mt::cpu
