#include "meshtrain/backend/attention.h"

// The fused attention on the CPU: per (batch·head) slice, blocks of 64 query rows go through
// oneDNN's GEMMs (forward S = Q·Kᵀ and O = P·V; backward S again, dP = dO·Vᵀ, dV += Pᵀ·dO,
// dK += dSᵀ·Q, dQ = dS·K) with the softmax, masks and dropout in f32 between them, so no
// (Tq, Tk) array is ever held and a block's scores stay in the cache. The operands are f32
// under f32 math (the reference every GPU kernel is tested against) and bf16 for bf16 arrays
// or a bf16 matmul precision, as the GPU's tensor cores multiply: q, k, v and dO rounded to
// bf16, P and dS rounded to bf16 for their products, f32 accumulation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/backend/cpu/fast_math.h"
#include "meshtrain/backend/matmul.h"
#include "meshtrain/backend/random.h"
#include "meshtrain/core/element.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

using kernels::FlashAttentionShape;

namespace {

using kernels::MatmulDType;

// Where slice `slice` of an array with `heads` heads and `rows` rows per slice starts, and how
// far apart its rows are: (B, H, T, D) slices are contiguous; heads-inner (B, T, H, D) rows
// are `ld` apart (H·D, or more in a packed projection).
struct SliceAt {
  int64_t first, ld;
};
SliceAt slice_at(const FlashAttentionShape& s, int64_t slice, int64_t heads, int64_t rows, int64_t ld) {
  if (!s.heads_inner) return {slice * rows * s.d, s.d};
  if (ld == 0) ld = heads * s.d;
  return {(slice / heads) * rows * ld + (slice % heads) * s.d, ld};
}
// The query inputs (q, dq: s.heads heads, Tq rows), the outputs' side (out and g: always H·D
// apart when heads inner) and the key side (k, v, dk, dv).
SliceAt query_slice(const FlashAttentionShape& s, int64_t bh) {
  return slice_at(s, bh, s.heads, s.tq, s.q_row_stride);
}
SliceAt output_slice(const FlashAttentionShape& s, int64_t bh) { return slice_at(s, bh, s.heads, s.tq, 0); }
SliceAt key_slice(const FlashAttentionShape& s, int64_t kv) {
  return slice_at(s, kv, s.heads / s.group, s.tk, s.kv_row_stride);
}

// The keys query row i sees: all, or up to the bottom-right causal diagonal.
int64_t visible_keys(const FlashAttentionShape& s, int64_t i) {
  return s.causal ? std::min(s.tk, i + (s.tk - s.tq) + 1) : s.tk;
}

// The key-padding mask of one (batch·head) slice: its row (null without a mask) and the
// score masked keys take, kMaskedScore. When no key is visible every score takes
// that one value, so the row is uniform: 0 serves (a finite lowest plus log n would round
// back to it in the log-sum-exp).
struct KeyMask {
  const bool* allowed = nullptr;
  float fill = 0.0f;
};

KeyMask key_mask_of(const FlashAttentionShape& s, int64_t bh) {
  if (!s.key_mask) return {};
  const bool* row = s.key_mask + (s.mask_batches == 1 ? 0 : bh / s.heads) * s.tk;
  const bool any = std::any_of(row, row + s.tk, [](bool a) { return a; });
  return {row, any ? kernels::kMaskedScore : 0.0f};
}

// Masked keys' scores take the mask's fill (rows `ld` apart, n keys each).
void mask_scores(const KeyMask& mask, int64_t rows, int64_t n, float* scores, int64_t ld) {
  if (!mask.allowed) return;
  const bool* allowed = mask.allowed;
  const float fill = mask.fill;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * ld;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] = allowed[j] ? row[j] : fill;
  }
}

// The composed form's where() passes no gradient to masked scores: zero their dS (only a row
// with no visible key has nonzero probabilities there).
void mask_score_gradients(const bool* allowed, int64_t n, float* ds_row) {
  if (!allowed) return;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) ds_row[j] = allowed[j] ? ds_row[j] : 0.0f;
}

// The dropout multipliers of row (bh, i): 0, or 1 / (1 - rate) where kept, from the same
// Philox stream dropout() draws on the (BH, Tq, Tk) probabilities.
// `keep` holds at least Tk floats: the draw runs on to a multiple of 64 keys (within the row),
// since fill_uniform takes whole groups of 64 through its vectorized Philox and the rest one
// block at a time, and a causal row's visible keys mostly end mid-group.
void keep_factors(const FlashAttentionShape& s, int64_t bh, int64_t i, int64_t n, float* keep) {
  // Resolved per row (a read and one Philox block): nothing beside a row of Philox blocks.
  const int64_t drawn = std::min(s.tk, (n + 63) / 64 * 64);
  fill_uniform(s.dropout_key.resolved(), uint64_t((bh * s.tq + i) * s.tk), drawn, keep);
  const float kept = float(1.0 / (1.0 - s.dropout_rate)), threshold = kernels::keep_threshold(s.dropout_rate);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) keep[j] = keep[j] >= threshold ? kept : 0.0f;
}

// Query rows per block: each GEMM is then large enough that oneDNN's per-call cost (a few
// microseconds) is small beside its work, and a block's f32 scores (64 × Tk) stay in L2.
constexpr int64_t kBlockRows = 64;

// Whether the products take bf16 operands: bf16 arrays, or a bf16 matmul precision in force
// when the op ran (s.operands), as on the GPU's tensor cores.
bool bf16_operands(const Array& q, const FlashAttentionShape& s) {
  return q.dtype() == DType::bf16 || s.operands == FlashAttentionShape::Operands::bf16;
}

// How the products take their operands (P below): the element type E the GEMMs multiply,
// oneDNN's kernel for it, and round_row, which turns f32 values (a slice's rows, P, dS) into
// operands.
// f32 math: operands as they are.
struct ExactF32 {
  using E = float;
  static constexpr MatmulDType gemm_dtype = MatmulDType::f32;
  static void round_row(const float* from, float* to, int64_t n) {  // in place: nothing to do
    if (from != to) std::memcpy(to, from, size_t(n) * sizeof(float));
  }
};
// bf16 operands where bf16 GEMMs run on oneDNN's bf16 kernels (cpu_features: AMX, a fast
// AVX512_BF16).
struct NativeBf16 {
  using E = bf16;
  static constexpr MatmulDType gemm_dtype = MatmulDType::bf16_f32;
  static void round_row(const float* from, bf16* to, int64_t n) {
    f32_to_bf16_n(from, reinterpret_cast<uint16_t*>(to), n);
  }
};
// bf16 operands elsewhere (AVX2, or a slow AVX512_BF16 dot product): f32 holding the rounded values, which the f32 GEMM multiplies
// as a native kernel does (products of bf16 values are exact in f32; only the order of the
// sums differs), without widening each operand again per call.
struct RoundedF32 {
  using E = float;
  static constexpr MatmulDType gemm_dtype = MatmulDType::f32;
  static void round_row(const float* from, float* to, int64_t n) { f32_round_to_bf16_n(from, to, n); }
};

// c (M, N) f32 (+)= op(a) · op(b) with a, b dense (row-major, as cpu::matmul takes them).
template <class P>
void gemm(const typename P::E* a, const typename P::E* b, float* c, int64_t M, int64_t N, int64_t K, bool trans_a,
          bool trans_b, bool accumulate) {
  matmul_in_kernel(P::gemm_dtype, a, b, c, M, N, K, trans_a, trans_b, accumulate);
}

// A slice's rows as a dense (rows, d) block of operands: the array's own memory where it
// already is that (rows d apart, in E, and needing no rounding), else a copy in `scratch`.
template <class P>
const typename P::E* operand_rows(const Array& x, SliceAt at, int64_t rows, int64_t d,
                                  std::vector<typename P::E>& scratch) {
  using E = typename P::E;
  if (at.ld == d) {
    if constexpr (std::is_same_v<P, NativeBf16>)
      if (x.dtype() == DType::bf16) return x.data<bf16>() + at.first;
    if constexpr (std::is_same_v<P, ExactF32>)
      if (x.dtype() == DType::f32) return x.data<float>() + at.first;
  }
  scratch.resize(size_t(rows * d));
  dispatch_float(x.dtype(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>() + at.first;
    std::vector<float> widened;
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = p + r * at.ld;
      E* row = scratch.data() + r * d;
      if constexpr (std::is_same_v<T, float>) {
        P::round_row(src, row, d);
      } else if constexpr (std::is_same_v<T, bf16> && std::is_same_v<E, bf16>) {
        std::memcpy(row, src, size_t(d) * sizeof(bf16));
      } else if constexpr (std::is_same_v<T, bf16>) {
        bf16_to_f32_n(reinterpret_cast<const uint16_t*>(src), row, d);  // exact: no rounding needed
      } else {
        widened.resize(size_t(d));
        for (int64_t c = 0; c < d; ++c) widened[size_t(c)] = load_f32(src[c]);
        P::round_row(widened.data(), row, d);
      }
    }
  });
  return scratch.data();
}

// Where a block's probabilities (or dS) go as GEMM operands: over their own f32 values when
// those are the operands (f32 math: nothing to round or copy), else into `rounded`, grown to
// hold `elements`.
template <class P>
typename P::E* block_operands(std::vector<float>& values, std::vector<typename P::E>& rounded, size_t elements) {
  if constexpr (std::is_same_v<P, ExactF32>) {
    return values.data();
  } else {
    rounded.resize(elements);
    return rounded.data();
  }
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

template <class P>
void forward_slices(const Array& q, const Array& k, const Array& v, const FlashAttentionShape& s, Array& out,
                    Array& lse) {
  const int64_t d = s.d, tq = s.tq, tk = s.tk;
  float* pl = lse.data<float>();
  const bool drop = s.dropout_rate > 0;
#pragma omp parallel if (s.batch_heads * tq * tk * d > grain::compute)
  {
    using E = typename P::E;
    std::vector<E> qb, kb, vb, rounded;
    std::vector<float> scores(size_t(kBlockRows * tk)), keep(static_cast<size_t>(tk)), o(size_t(kBlockRows * d));
    E* probs = block_operands<P>(scores, rounded, scores.size());
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < s.batch_heads; ++bh) {
      const int64_t kv = bh / s.group;
      const E* qs = operand_rows<P>(q, query_slice(s, bh), tq, d, qb);
      const E* ks = operand_rows<P>(k, key_slice(s, kv), tk, d, kb);
      const E* vs = operand_rows<P>(v, key_slice(s, kv), tk, d, vb);
      const KeyMask mask = key_mask_of(s, bh);
      for (int64_t i0 = 0; i0 < tq; i0 += kBlockRows) {
        const Block blk = block_at(s, i0);
        const int64_t n = blk.keys;
        if (n > 0) gemm<P>(qs + i0 * d, ks, scores.data(), blk.rows, n, d, false, true, false);
        for (int64_t r = 0; r < blk.rows; ++r) {
          float* sr = scores.data() + r * n;
          E* pr = probs + r * n;
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
          P::round_row(sr, pr, ni);
          std::fill(pr + ni, pr + n, E{});  // keys the block's later rows see
        }
        if (n > 0) gemm<P>(probs, vs, o.data(), blk.rows, d, n, false, false, false);
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

template <class P>
void backward_slices(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse, const Array& g,
                     const FlashAttentionShape& s, Array& dq, Array& dk, Array& dv) {
  const int64_t d = s.d, tq = s.tq, tk = s.tk;
  const float* pl = lse.data<float>();
  const bool drop = s.dropout_rate > 0;
  // Each key/value slice is independent: one task owns its rows of dk and dv, summed over its
  // group's query heads, and those heads' rows of dq.
#pragma omp parallel if (s.batch_heads * tq * tk * d > grain::compute)
  {
    using E = typename P::E;
    std::vector<E> qb, kb, vb, gb, rounded_p, rounded_ds;
    std::vector<float> scores(size_t(kBlockRows * tk)), dprobs(size_t(kBlockRows * tk)), di;
    E* probs = block_operands<P>(scores, rounded_p, scores.size());
    E* dsb = block_operands<P>(dprobs, rounded_ds, dprobs.size());
    std::vector<float> keep(static_cast<size_t>(tk), 1.0f);  // all kept without dropout
    std::vector<float> dqf(size_t(kBlockRows * d)), dkf, dvf;
#pragma omp for schedule(dynamic, 1)
    for (int64_t kv = 0; kv < s.batch_heads / s.group; ++kv) {
      const E* ks = operand_rows<P>(k, key_slice(s, kv), tk, d, kb);
      const E* vs = operand_rows<P>(v, key_slice(s, kv), tk, d, vb);
      dkf.assign(size_t(tk * d), 0.0f);
      dvf.assign(size_t(tk * d), 0.0f);
      for (int64_t bh = kv * s.group; bh < (kv + 1) * s.group; ++bh) {
        const E* qs = operand_rows<P>(q, query_slice(s, bh), tq, d, qb);
        const E* gs = operand_rows<P>(g, output_slice(s, bh), tq, d, gb);
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
          gemm<P>(qs + i0 * d, ks, scores.data(), blk.rows, n, d, false, true, false);
          gemm<P>(gs + i0 * d, vs, dprobs.data(), blk.rows, n, d, false, true, false);
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
            E* pr = probs + r * n;
            E* dsr = dsb + r * n;
            P::round_row(sr, pr, ni);
            P::round_row(dpr, dsr, ni);
            std::fill(pr + ni, pr + n, E{});
            std::fill(dsr + ni, dsr + n, E{});
          }
          // dV += Pᵀ dO and dK += dSᵀ Q over the block's keys; dQ = dS K for its rows.
          gemm<P>(probs, gs + i0 * d, dvf.data(), n, d, blk.rows, true, false, true);
          gemm<P>(dsb, qs + i0 * d, dkf.data(), n, d, blk.rows, true, false, true);
          gemm<P>(dsb, ks, dqf.data(), blk.rows, d, n, false, false, false);
          store_rows(dqf.data(), i0, blk.rows, d, dq, query_slice(s, bh));
        }
      }
      store_rows(dkf.data(), 0, tk, d, dk, key_slice(s, kv));
      store_rows(dvf.data(), 0, tk, d, dv, key_slice(s, kv));
    }
  }
}

}  // namespace

void flash_attention_forward(const Array& q, const Array& k, const Array& v, const FlashAttentionShape& s, Array& out,
                             Array& lse) {
  if (!bf16_operands(q, s)) forward_slices<ExactF32>(q, k, v, s, out, lse);
  else if (cpu_features().bf16_gemm_native) forward_slices<NativeBf16>(q, k, v, s, out, lse);
  else forward_slices<RoundedF32>(q, k, v, s, out, lse);
}

void flash_attention_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                              const Array& g, const FlashAttentionShape& s, Array& dq, Array& dk, Array& dv) {
  if (!bf16_operands(q, s)) backward_slices<ExactF32>(q, k, v, out, lse, g, s, dq, dk, dv);
  else if (cpu_features().bf16_gemm_native) backward_slices<NativeBf16>(q, k, v, out, lse, g, s, dq, dk, dv);
  else backward_slices<RoundedF32>(q, k, v, out, lse, g, s, dq, dk, dv);
}

}  // namespace mt::cpu
