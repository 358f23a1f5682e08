// The fused attention with bf16 operands on the CPU: blocks of query rows through oneDNN's
// GEMMs, the softmax, masks and dropout in f32 between them (attention_slices.h says what
// the two CPU forms share). The f32 vector kernel (attention.cpp) multiplies on 8-float
// vectors; here the products run on the CPU's bf16 units, two to four times its f32 rate, and
// the (rows, keys) blocks stay in the cache, where the composed form writes and reads the
// whole (B, H, Tq, Tk) probabilities several times a layer.
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "meshtrain/backend/cpu/attention_slices.h"
#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/backend/cpu/fast_math.h"
#include "meshtrain/backend/matmul.h"
#include "meshtrain/core/element.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu::attention {

namespace {

using kernels::MatmulDType;

// Query rows per block: each GEMM is then large enough that oneDNN's per-call cost (a few
// microseconds) is small beside its work, and a block's f32 scores (64 × Tk) stay in L2.
constexpr int64_t kBlockRows = 64;

// The GEMM operands hold bf16 values in E: bf16 itself where oneDNN multiplies bf16 natively
// (AVX512_BF16, AMX), else f32 holding the rounded values, which the f32 GEMM multiplies
// exactly as a native kernel does (products of bf16 values are exact in f32; only the order
// of the f32 sums differs), without widening each operand again per call.
template <class E>
E round_to(float x) {
  if constexpr (std::is_same_v<E, bf16>) return f32_to_bf16(x);
  else return bf16_to_f32(f32_to_bf16(x));
}

// c (M, N) f32 (+)= op(a) · op(b) with a, b dense in E (row-major, as cpu::matmul takes them).
template <class E>
void gemm(const E* a, const E* b, float* c, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b,
          bool accumulate) {
  constexpr MatmulDType dtype = std::is_same_v<E, bf16> ? MatmulDType::bf16_f32 : MatmulDType::f32;
  cpu::matmul(dtype, a, b, c, 1, 1, 1, M, N, K, trans_a, trans_b, accumulate);
}

// n f32 values rounded to bf16, into E.
void round_row(const float* from, bf16* to, int64_t n) { f32_to_bf16_n(from, reinterpret_cast<uint16_t*>(to), n); }
void round_row(const float* from, float* to, int64_t n) { f32_round_to_bf16_n(from, to, n); }

// A slice's rows as a dense (rows, d) block of E, every value rounded to bf16: the array's
// own memory when it is already that (bf16, rows d apart), else a copy in `scratch`.
template <class E>
const E* operand_rows(const Array& x, SliceAt at, int64_t rows, int64_t d, std::vector<E>& scratch) {
  if constexpr (std::is_same_v<E, bf16>)
    if (x.dtype() == DType::bf16 && at.ld == d) return x.data<bf16>() + at.first;
  scratch.resize(size_t(rows * d));
  dispatch_float(x.dtype(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>() + at.first;
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = p + r * at.ld;
      E* row = scratch.data() + r * d;
      if constexpr (std::is_same_v<T, E>) {
        if constexpr (std::is_same_v<T, float>) round_row(src, row, d);
        else std::memcpy(row, src, size_t(d) * sizeof(E));
      } else if constexpr (std::is_same_v<T, float>) {
        round_row(src, row, d);
      } else if constexpr (std::is_same_v<T, bf16>) {
        bf16_to_f32_n(reinterpret_cast<const uint16_t*>(src), row, d);
      } else {
        for (int64_t c = 0; c < d; ++c) row[c] = round_to<E>(load_f32(src[c]));
      }
    }
  });
  return scratch.data();
}

// Rows [row0, row0 + rows) of a slice of x from dense (rows, d) f32, in x's dtype.
void store_rows(const float* from, int64_t row0, int64_t rows, int64_t d, Array& x, SliceAt at) {
  dispatch_float(x.dtype(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    T* p = x.data<T>() + at.first + row0 * at.ld;
    for (int64_t r = 0; r < rows; ++r) {
      if constexpr (std::is_same_v<T, float>) std::memcpy(p + r * at.ld, from + r * d, size_t(d) * sizeof(float));
      else if constexpr (std::is_same_v<T, bf16>) f32_to_bf16_n(from + r * d, reinterpret_cast<uint16_t*>(p + r * at.ld), d);
      else for (int64_t c = 0; c < d; ++c) p[r * at.ld + c] = store_f32<T>(from[r * d + c]);
    }
  });
}

// Row i's scores: scale · q_i·k_j for its n visible keys, masked keys at the mask's fill.
void scale_and_mask(float* row, int64_t n, float scale, const KeyMask& mask) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) row[j] *= scale;
  mask_scores(mask, 1, n, row, n);
}

// A block of query rows [i0, i0 + rows) and the keys its last row sees (the most of any of
// its rows under the bottom-right causal mask); a row's own count is visible_keys().
struct Block {
  int64_t i0, rows, keys;
};
Block block_at(const FlashAttentionShape& s, int64_t i0) {
  const int64_t rows = std::min(kBlockRows, s.tq - i0);
  return {i0, rows, std::max<int64_t>(0, visible_keys(s, i0 + rows - 1))};
}

template <class E>
void forward_slices(const Array& q, const Array& k, const Array& v, const FlashAttentionShape& s, Array& out,
                    Array& lse) {
  const int64_t d = s.d, tq = s.tq, tk = s.tk;
  float* pl = lse.data<float>();
  const bool drop = s.dropout_rate > 0;
#pragma omp parallel if (s.batch_heads * tq * tk * d > grain::compute)
  {
    std::vector<E> qb, kb, vb, probs(size_t(kBlockRows * tk));
    std::vector<float> scores(size_t(kBlockRows * tk)), keep(static_cast<size_t>(tk)), o(size_t(kBlockRows * d));
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < s.batch_heads; ++bh) {
      const int64_t kv = bh / s.group;
      const E* qs = operand_rows(q, query_slice(s, bh), tq, d, qb);
      const E* ks = operand_rows(k, key_slice(s, kv), tk, d, kb);
      const E* vs = operand_rows(v, key_slice(s, kv), tk, d, vb);
      const KeyMask mask = key_mask_of(s, bh);
      for (int64_t i0 = 0; i0 < tq; i0 += kBlockRows) {
        const Block blk = block_at(s, i0);
        const int64_t n = blk.keys;
        if (n > 0) gemm(qs + i0 * d, ks, scores.data(), blk.rows, n, d, false, true, false);
        for (int64_t r = 0; r < blk.rows; ++r) {
          float* sr = scores.data() + r * n;
          E* pr = probs.data() + r * n;
          const int64_t ni = std::max<int64_t>(0, visible_keys(s, i0 + r));
          scale_and_mask(sr, ni, s.scale, mask);
          float m = -INFINITY;
          for (int64_t j = 0; j < ni; ++j) m = std::max(m, sr[j]);
          double sum = 0;  // in double, as the composed softmax sums
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < ni; ++j) {
            sr[j] = fast_exp(sr[j] - m);
            sum += double(sr[j]);
          }
          pl[bh * tq + i0 + r] = m + float(std::log(sum));
          const float inv = float(1.0 / sum);
          if (drop) {
            keep_factors(s, bh, i0 + r, ni, keep.data());
            const float* kp = keep.data();
#pragma omp simd
            for (int64_t j = 0; j < ni; ++j) sr[j] *= inv * kp[j];
          } else {
#pragma omp simd
            for (int64_t j = 0; j < ni; ++j) sr[j] *= inv;
          }
          round_row(sr, pr, ni);
          std::fill(pr + ni, pr + n, E{});  // keys the block's later rows see
        }
        if (n > 0) gemm(probs.data(), vs, o.data(), blk.rows, d, n, false, false, false);
        else std::fill(o.begin(), o.end(), 0.0f);
        store_rows(o.data(), i0, blk.rows, d, out, output_slice(s, bh));
      }
    }
  }
}

// D_i = Σ_c dO_ic · O_ic for every query row of slice bh, in double (dS subtracts it from
// each dP_ij, where cancellation would magnify its rounding).
void row_dots(const Array& g, const Array& out, SliceAt at, int64_t tq, int64_t d, std::vector<float>& di) {
  di.resize(size_t(tq));
  dispatch_float(g.dtype(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    const T* gp = g.data<T>() + at.first;
    const T* op = out.data<T>() + at.first;
    for (int64_t i = 0; i < tq; ++i) {
      double sum = 0;
      for (int64_t c = 0; c < d; ++c) sum += double(load_f32(gp[i * at.ld + c])) * double(load_f32(op[i * at.ld + c]));
      di[size_t(i)] = float(sum);
    }
  });
}

template <class E>
void backward_slices(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse, const Array& g,
                     const FlashAttentionShape& s, Array& dq, Array& dk, Array& dv) {
  const int64_t d = s.d, tq = s.tq, tk = s.tk;
  const float* pl = lse.data<float>();
  const bool drop = s.dropout_rate > 0;
  // Each key/value slice is independent: one task owns its rows of dk and dv, summed over its
  // group's query heads, and those heads' rows of dq.
#pragma omp parallel if (s.batch_heads * tq * tk * d > grain::compute)
  {
    std::vector<E> qb, kb, vb, gb, probs(size_t(kBlockRows * tk)), dsb(size_t(kBlockRows * tk));
    std::vector<float> scores(size_t(kBlockRows * tk)), dprobs(size_t(kBlockRows * tk)), di;
    std::vector<float> keep(static_cast<size_t>(tk), 1.0f);  // all kept without dropout
    std::vector<float> dqf(size_t(kBlockRows * d)), dkf, dvf;
#pragma omp for schedule(dynamic, 1)
    for (int64_t kv = 0; kv < s.batch_heads / s.group; ++kv) {
      const E* ks = operand_rows(k, key_slice(s, kv), tk, d, kb);
      const E* vs = operand_rows(v, key_slice(s, kv), tk, d, vb);
      dkf.assign(size_t(tk * d), 0.0f);
      dvf.assign(size_t(tk * d), 0.0f);
      for (int64_t bh = kv * s.group; bh < (kv + 1) * s.group; ++bh) {
        const E* qs = operand_rows(q, query_slice(s, bh), tq, d, qb);
        const E* gs = operand_rows(g, output_slice(s, bh), tq, d, gb);
        row_dots(g, out, output_slice(s, bh), tq, d, di);
        const KeyMask mask = key_mask_of(s, bh);
        for (int64_t i0 = 0; i0 < tq; i0 += kBlockRows) {
          const Block blk = block_at(s, i0);
          const int64_t n = blk.keys;
          if (n == 0) {
            std::fill(dqf.begin(), dqf.end(), 0.0f);
            store_rows(dqf.data(), i0, blk.rows, d, dq, query_slice(s, bh));
            continue;
          }
          // S recomputed (P from the saved log-sum-exps); dP_ij = dO_i · V_j.
          gemm(qs + i0 * d, ks, scores.data(), blk.rows, n, d, false, true, false);
          gemm(gs + i0 * d, vs, dprobs.data(), blk.rows, n, d, false, true, false);
          for (int64_t r = 0; r < blk.rows; ++r) {
            const int64_t i = i0 + r, ni = std::max<int64_t>(0, visible_keys(s, i));
            float* sr = scores.data() + r * n;
            float* dpr = dprobs.data() + r * n;
            scale_and_mask(sr, ni, s.scale, mask);
            if (drop) keep_factors(s, bh, i, ni, keep.data());
            const float row_lse = pl[bh * tq + i], dot = di[size_t(i)], scale = s.scale;
            const float* kp = keep.data();
#pragma omp simd
            for (int64_t j = 0; j < ni; ++j) {
              const float pj = fast_exp(sr[j] - row_lse);
              const float kj = kp[j];
              dpr[j] = pj * (kj * dpr[j] - dot) * scale;  // dS
              sr[j] = pj * kj;                            // P with dropout applied
            }
            mask_score_gradients(mask.allowed, ni, dpr);
            E* pr = probs.data() + r * n;
            E* dsr = dsb.data() + r * n;
            round_row(sr, pr, ni);
            round_row(dpr, dsr, ni);
            std::fill(pr + ni, pr + n, E{});
            std::fill(dsr + ni, dsr + n, E{});
          }
          // dV += Pᵀ dO and dK += dSᵀ Q over the block's keys; dQ = dS K for its rows.
          gemm(probs.data(), gs + i0 * d, dvf.data(), n, d, blk.rows, true, false, true);
          gemm(dsb.data(), qs + i0 * d, dkf.data(), n, d, blk.rows, true, false, true);
          gemm(dsb.data(), ks, dqf.data(), blk.rows, d, n, false, false, false);
          store_rows(dqf.data(), i0, blk.rows, d, dq, query_slice(s, bh));
        }
      }
      store_rows(dkf.data(), 0, tk, d, dk, key_slice(s, kv));
      store_rows(dvf.data(), 0, tk, d, dv, key_slice(s, kv));
    }
  }
}

}  // namespace

void gemm_forward(const Array& q, const Array& k, const Array& v, const FlashAttentionShape& s, Array& out,
                  Array& lse) {
  if (cpu_features().bf16_gemm_native) forward_slices<bf16>(q, k, v, s, out, lse);
  else forward_slices<float>(q, k, v, s, out, lse);
}

void gemm_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                   const Array& g, const FlashAttentionShape& s, Array& dq, Array& dk, Array& dv) {
  if (cpu_features().bf16_gemm_native) backward_slices<bf16>(q, k, v, out, lse, g, s, dq, dk, dv);
  else backward_slices<float>(q, k, v, out, lse, g, s, dq, dk, dv);
}

}  // namespace mt::cpu::attention
