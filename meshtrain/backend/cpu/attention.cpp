#include "meshtrain/backend/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "meshtrain/backend/cpu/attention_slices.h"
#include "meshtrain/backend/cpu/fast_math.h"
#include "meshtrain/backend/random.h"
#include "meshtrain/core/element.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

using kernels::FlashAttentionShape;

namespace {

using namespace attention;

// The products run on 8-float vectors (GCC vector extensions: AVX2 in the x86-64-v3 build),
// four query rows at a time, with partial sums in registers: the (Tq, Tk) scores exist only
// as the current rows' slices. Head dims that are not a multiple of 8 take scalar loops.
typedef float v8f __attribute__((vector_size(32), aligned(4)));  // unaligned loads and stores
constexpr int kRows = 4;
constexpr int64_t kKeys = 16;  // keys per block of scores: two vectors

inline v8f load8(const float* p) { return *reinterpret_cast<const v8f*>(p); }
inline void store8(float* p, v8f v) { *reinterpret_cast<v8f*>(p) = v; }
inline v8f splat(float x) { return v8f{} + x; }

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// One (batch·head) slice of an input as f32 rows of `dp` >= d floats (the head dim rounded
// up to the vector width; the extra columns are zeros, which change no dot product): the
// array's own memory when it is f32, contiguous and d == dp, else a converted copy in
// `scratch`.
const float* f32_slice(const Array& x, SliceAt at, int64_t rows, int64_t d, int64_t dp, std::vector<float>& scratch) {
  if (x.dtype() == DType::f32 && d == dp && at.ld == d) return x.data<float>() + at.first;
  scratch.assign(size_t(rows * dp), 0.0f);
  dispatch_float(x.dtype(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>() + at.first;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c) scratch[size_t(r * dp + c)] = load_f32(p[r * at.ld + c]);
  });
  return scratch.data();
}

// The first d of every dp floats of `from` into a slice of x, in x's dtype.
void store_slice(const float* from, int64_t rows, int64_t d, int64_t dp, Array& x, SliceAt at) {
  dispatch_float(x.dtype(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    T* p = x.data<T>() + at.first;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c) p[r * at.ld + c] = store_f32<T>(from[r * dp + c]);
  });
}

// (rows, d) -> (d, stride) with stride = rows rounded up to kKeys and zero columns after
// `rows`: keys as columns, so 16 keys' scores accumulate lane by lane over the head dim.
void transpose_into(const float* x, int64_t rows, int64_t d, std::vector<float>& out) {
  const int64_t stride = round_up(rows, kKeys);
  out.assign(size_t(d * stride), 0.0f);
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t c = 0; c < d; ++c) out[size_t(c * stride + j)] = x[j * d + c];
}

// out[r][j] = scale · Σ_c a[r][c] · bt[c][j] for r < rows (<= kRows), j < n rounded up to
// kKeys; a: rows of length d; bt: (d, stride) from transpose_into; out rows `ld` apart.
void rows_times_columns(const float* a, int rows, const float* bt, int64_t d, int64_t stride, int64_t n, float scale,
                        float* out, int64_t ld) {
  for (int64_t j0 = 0; j0 < n; j0 += kKeys) {
    v8f acc[kRows][2] = {};
    for (int64_t c = 0; c < d; ++c) {
      const v8f b0 = load8(bt + c * stride + j0), b1 = load8(bt + c * stride + j0 + 8);
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
        const v8f ar = splat(a[r * d + c]);
        acc[r][0] += ar * b0;
        acc[r][1] += ar * b1;
      }
    }
    for (int r = 0; r < rows; ++r) {
      store8(out + r * ld + j0, acc[r][0] * scale);
      store8(out + r * ld + j0 + 8, acc[r][1] * scale);
    }
  }
}

// out[r][c] (+)= Σ_{j<n} p[r][j] · m[j][c] for r < rows, c < d (d a multiple of 8); p rows
// `ld` apart, m (n, d), out rows d apart.
void probs_times_rows(const float* p, int rows, int64_t ld, const float* m, int64_t n, int64_t d, float* out,
                      bool accumulate) {
  for (int64_t c0 = 0; c0 < d; c0 += 16) {
    const bool two = c0 + 16 <= d;
    v8f acc[kRows][2] = {};
    for (int64_t j = 0; j < n; ++j) {
      const v8f m0 = load8(m + j * d + c0), m1 = two ? load8(m + j * d + c0 + 8) : v8f{};
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
        const v8f pr = splat(p[r * ld + j]);
        acc[r][0] += pr * m0;
        acc[r][1] += pr * m1;
      }
    }
    for (int r = 0; r < rows; ++r) {
      float* o = out + r * d + c0;
      store8(o, accumulate ? load8(o) + acc[r][0] : acc[r][0]);
      if (two) store8(o + 8, accumulate ? load8(o + 8) + acc[r][1] : acc[r][1]);
    }
  }
}

// m[j][c] += Σ_r p[r][j] · x[r][c] for j < n, c < d (d a multiple of 8): the rank-`rows`
// update of dK and dV; x's rows stay in registers while m's rows stream.
void probs_transposed_times_rows(const float* p, int rows, int64_t ld, const float* x, int64_t n, int64_t d,
                                 float* m) {
  for (int64_t c0 = 0; c0 < d; c0 += 16) {
    const bool two = c0 + 16 <= d;
    v8f xr[kRows][2] = {};
    for (int r = 0; r < rows; ++r) {
      xr[r][0] = load8(x + r * d + c0);
      if (two) xr[r][1] = load8(x + r * d + c0 + 8);
    }
    for (int64_t j = 0; j < n; ++j) {
      float* mj = m + j * d + c0;
      v8f a0 = load8(mj), a1 = two ? load8(mj + 8) : v8f{};
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
        const v8f pr = splat(p[r * ld + j]);
        a0 += pr * xr[r][0];
        a1 += pr * xr[r][1];
      }
      store8(mj, a0);
      if (two) store8(mj + 8, a1);
    }
  }
}

// Per-thread scratch, reused across (batch·head) slices.
struct Scratch {
  std::vector<float> q, k, v, o, g, kt, vt, probs, scaled, keep, dq, dk, dv;
};

// Group of up to kRows query rows starting at i0, and the keys the last of them sees (the
// most in the group: visibility grows with the row under the bottom-right causal mask).
struct RowGroup {
  int64_t i0;
  int rows;
  int64_t keys;
};

RowGroup row_group(const FlashAttentionShape& s, int64_t i0) {
  const int rows = int(std::min<int64_t>(kRows, s.tq - i0));
  return {i0, rows, visible_keys(s, i0 + rows - 1)};
}

int64_t padded_dim(int64_t d) { return round_up(d, 8); }

}  // namespace

void flash_attention_forward(const Array& q, const Array& k, const Array& v, const FlashAttentionShape& s, Array& out,
                             Array& lse) {
  if (attention::bf16_operands(q, s)) return attention::gemm_forward(q, k, v, s, out, lse);
  const int64_t d = s.d, dp = padded_dim(d), tq = s.tq, tk = s.tk, stride = round_up(tk, kKeys);
  float* pl = lse.data<float>();
  const bool direct = out.dtype() == DType::f32 && d == dp && !s.heads_inner;
  // One query head's slice per task (as many tasks as query heads, grouped or not): the keys
  // of its key/value slice bh / group are transposed once for all its queries.
#pragma omp parallel if (s.batch_heads * tq * tk * d > grain::compute)
  {
    Scratch w;
    w.probs.resize(size_t(kRows * stride));
    w.keep.resize(size_t(stride));
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < s.batch_heads; ++bh) {
      const int64_t kv = bh / s.group;
      const float* qs = f32_slice(q, query_slice(s, bh), tq, d, dp, w.q);
      const float* ks = f32_slice(k, key_slice(s, kv), tk, d, dp, w.k);
      const float* vs = f32_slice(v, key_slice(s, kv), tk, d, dp, w.v);
      transpose_into(ks, tk, dp, w.kt);
      const KeyMask mask = key_mask_of(s, bh);
      if (!direct) w.o.resize(size_t(tq * dp));
      float* os = direct ? out.data<float>() + bh * tq * d : w.o.data();
      for (int64_t i0 = 0; i0 < tq; i0 += kRows) {
        const RowGroup grp = row_group(s, i0);
        float* p = w.probs.data();
        rows_times_columns(qs + i0 * dp, grp.rows, w.kt.data(), dp, stride, grp.keys, s.scale, p, stride);
        mask_scores(mask, grp.rows, grp.keys, p, stride);
        for (int r = 0; r < grp.rows; ++r) {
          float* pr = p + r * stride;
          const int64_t n = visible_keys(s, i0 + r);
          float m = -INFINITY;
          for (int64_t j = 0; j < n; ++j) m = std::max(m, pr[j]);
          double sum = 0;  // in double, as the composed softmax sums
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < n; ++j) {
            pr[j] = fast_exp(pr[j] - m);
            sum += double(pr[j]);
          }
          pl[bh * tq + i0 + r] = m + float(std::log(sum));
          const float l = float(sum);
          if (s.dropout_rate > 0) {
            keep_factors(s, bh, i0 + r, n, w.keep.data());
            for (int64_t j = 0; j < n; ++j) pr[j] = pr[j] / l * w.keep[size_t(j)];
          } else {
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) pr[j] /= l;
          }
          std::fill(pr + n, pr + grp.keys, 0.0f);  // keys the group's later rows see
        }
        probs_times_rows(p, grp.rows, stride, vs, grp.keys, dp, os + i0 * dp, false);
      }
      if (!direct) store_slice(os, tq, d, dp, out, output_slice(s, bh));
    }
  }
}

void flash_attention_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                              const Array& g, const FlashAttentionShape& s, Array& dq, Array& dk, Array& dv) {
  if (attention::bf16_operands(q, s))
    return attention::gemm_backward(q, k, v, out, lse, g, s, dq, dk, dv);
  const int64_t d = s.d, dp = padded_dim(d), tq = s.tq, tk = s.tk, stride = round_up(tk, kKeys);
  const float* pl = lse.data<float>();
  // Each key/value slice is independent: one task owns its rows of dk and dv, summed over
  // its group's query heads, and those heads' rows of dq.
#pragma omp parallel if (s.batch_heads * tq * tk * d > grain::compute)
  {
    Scratch w;
    w.probs.resize(size_t(kRows * stride));
    w.scaled.resize(size_t(kRows * stride));
    w.keep.resize(size_t(stride));
#pragma omp for schedule(dynamic, 1)
    for (int64_t kv = 0; kv < s.batch_heads / s.group; ++kv) {
      const float* ks = f32_slice(k, key_slice(s, kv), tk, d, dp, w.k);
      const float* vs = f32_slice(v, key_slice(s, kv), tk, d, dp, w.v);
      transpose_into(ks, tk, dp, w.kt);
      transpose_into(vs, tk, dp, w.vt);
      w.dk.assign(size_t(tk * dp), 0.0f);
      w.dv.assign(size_t(tk * dp), 0.0f);
      for (int64_t bh = kv * s.group; bh < (kv + 1) * s.group; ++bh) {
        const float* qs = f32_slice(q, query_slice(s, bh), tq, d, dp, w.q);
        const float* os = f32_slice(out, output_slice(s, bh), tq, d, dp, w.o);
        const float* gs = f32_slice(g, output_slice(s, bh), tq, d, dp, w.g);
        const KeyMask mask = key_mask_of(s, bh);
        w.dq.assign(size_t(tq * dp), 0.0f);
        for (int64_t i0 = 0; i0 < tq; i0 += kRows) {
          const RowGroup grp = row_group(s, i0);
          float* p = w.probs.data();  // P, then P with dropout applied
          float* ds = w.scaled.data();  // dP = dO · Vᵀ, then dS
          // P recomputed from the saved log-sum-exps; dP_ij = dO_i · V_j.
          rows_times_columns(qs + i0 * dp, grp.rows, w.kt.data(), dp, stride, grp.keys, s.scale, p, stride);
          mask_scores(mask, grp.rows, grp.keys, p, stride);
          rows_times_columns(gs + i0 * dp, grp.rows, w.vt.data(), dp, stride, grp.keys, 1.0f, ds, stride);
          for (int r = 0; r < grp.rows; ++r) {
            const int64_t i = i0 + r, n = visible_keys(s, i);
            float* pr = p + r * stride;
            float* dsr = ds + r * stride;
            const float row_lse = pl[bh * tq + i];
            // Σ_j P_ij dP_ij = dO_i · O_i (with the dropped-out P), in double: dS subtracts it
            // from each dP_ij, where cancellation would magnify its rounding.
            double dsum = 0;
  #pragma omp simd reduction(+ : dsum)
            for (int64_t c = 0; c < dp; ++c) dsum += double(gs[i * dp + c]) * double(os[i * dp + c]);
            const float di = float(dsum);
            const bool drop = s.dropout_rate > 0;
            if (drop) keep_factors(s, bh, i, n, w.keep.data());
            const float scale = s.scale;
  #pragma omp simd
            for (int64_t j = 0; j < n; ++j) {
              const float pj = fast_exp(pr[j] - row_lse);
              const float keep = drop ? w.keep[size_t(j)] : 1.0f;
              dsr[j] = pj * (keep * dsr[j] - di) * scale;
              pr[j] = pj * keep;
            }
            mask_score_gradients(mask.allowed, n, dsr);
            std::fill(pr + n, pr + grp.keys, 0.0f);
            std::fill(dsr + n, dsr + grp.keys, 0.0f);
          }
          probs_transposed_times_rows(p, grp.rows, stride, gs + i0 * dp, grp.keys, dp, w.dv.data());
          probs_transposed_times_rows(ds, grp.rows, stride, qs + i0 * dp, grp.keys, dp, w.dk.data());
          probs_times_rows(ds, grp.rows, stride, ks, grp.keys, dp, w.dq.data() + i0 * dp, false);
        }
        store_slice(w.dq.data(), tq, d, dp, dq, query_slice(s, bh));
      }
      store_slice(w.dk.data(), tk, d, dp, dk, key_slice(s, kv));
      store_slice(w.dv.data(), tk, d, dp, dv, key_slice(s, kv));
    }
  }
}

}  // namespace mt::cpu
