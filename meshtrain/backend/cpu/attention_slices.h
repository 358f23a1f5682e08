#pragma once
// What the CPU's two fused attention forms share (attention.cpp: f32 products on vectors;
// attention_gemm.cpp: bf16 operands through oneDNN's GEMMs): where a (batch·head) slice of an
// array lives, which keys a query row sees, the key-padding mask and the dropout factors.
#include <algorithm>
#include <cstdint>

#include "meshtrain/backend/attention.h"
#include "meshtrain/backend/random.h"
#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"

namespace mt::cpu::attention {

using kernels::FlashAttentionShape;

// Where slice `slice` of an array with `heads` heads and `rows` rows per slice starts, and how
// far apart its rows are: (B, H, T, D) slices are contiguous; heads-inner (B, T, H, D) rows
// are `ld` apart (H·D, or more in a packed projection).
struct SliceAt {
  int64_t first, ld;
};
inline SliceAt slice_at(const FlashAttentionShape& s, int64_t slice, int64_t heads, int64_t rows, int64_t ld) {
  if (!s.heads_inner) return {slice * rows * s.d, s.d};
  if (ld == 0) ld = heads * s.d;
  return {(slice / heads) * rows * ld + (slice % heads) * s.d, ld};
}
// The query inputs (q, dq: s.heads heads, Tq rows), the outputs' side (out and g: always H·D
// apart when heads inner) and the key side (k, v, dk, dv).
inline SliceAt query_slice(const FlashAttentionShape& s, int64_t bh) {
  return slice_at(s, bh, s.heads, s.tq, s.q_row_stride);
}
inline SliceAt output_slice(const FlashAttentionShape& s, int64_t bh) { return slice_at(s, bh, s.heads, s.tq, 0); }
inline SliceAt key_slice(const FlashAttentionShape& s, int64_t kv) {
  return slice_at(s, kv, s.heads / s.group, s.tk, s.kv_row_stride);
}

// The keys query row i sees: all, or up to the bottom-right causal diagonal.
inline int64_t visible_keys(const FlashAttentionShape& s, int64_t i) {
  return s.causal ? std::min(s.tk, i + (s.tk - s.tq) + 1) : s.tk;
}

// The key-padding mask of one (batch·head) slice: its row (null without a mask) and the
// score masked keys take, the lowest finite float. When no key is visible every score takes
// that one value, so the row is uniform: 0 serves (a finite lowest plus log n would round
// back to lowest in the log-sum-exp).
struct KeyMask {
  const bool* allowed = nullptr;
  float fill = 0.0f;
};

inline KeyMask key_mask_of(const FlashAttentionShape& s, int64_t bh) {
  if (!s.key_mask) return {};
  const bool* row = s.key_mask + (s.mask_batches == 1 ? 0 : bh / s.heads) * s.tk;
  const bool any = std::any_of(row, row + s.tk, [](bool a) { return a; });
  return {row, any ? -3.40282347e38f : 0.0f};
}

// Masked keys' scores take the mask's fill (rows `ld` apart, n keys each).
inline void mask_scores(const KeyMask& mask, int64_t rows, int64_t n, float* scores, int64_t ld) {
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
inline void mask_score_gradients(const bool* allowed, int64_t n, float* ds_row) {
  if (!allowed) return;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) ds_row[j] = allowed[j] ? ds_row[j] : 0.0f;
}

// The dropout multipliers of row (bh, i): 0, or 1 / (1 - rate) where kept, from the same
// Philox stream dropout() draws on the (BH, Tq, Tk) probabilities.
// `keep` holds at least Tk floats: the draw runs on to a multiple of 64 keys (within the row),
// since fill_uniform takes whole groups of 64 through its vectorized Philox and the rest one
// block at a time, and a causal row's visible keys mostly end mid-group.
inline void keep_factors(const FlashAttentionShape& s, int64_t bh, int64_t i, int64_t n, float* keep) {
  // Resolved per row (a read and one Philox block): nothing beside a row of Philox blocks.
  const int64_t drawn = std::min(s.tk, (n + 63) / 64 * 64);
  fill_uniform(s.dropout_key.resolved(), uint64_t((bh * s.tq + i) * s.tk), drawn, keep);
  const float kept = float(1.0 / (1.0 - s.dropout_rate)), threshold = kernels::keep_threshold(s.dropout_rate);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) keep[j] = keep[j] >= threshold ? kept : 0.0f;
}

// Whether the products take bf16 operands: bf16 arrays, or a bf16 matmul precision in force
// when the op ran (s.operands), as on the GPU's tensor cores.
inline bool bf16_operands(const Array& q, const FlashAttentionShape& s) {
  return q.dtype() == DType::bf16 || s.operands == FlashAttentionShape::Operands::bf16;
}

// The same primitive with bf16 operands (bf16_operands),
// as the GPU's tensor-core kernels multiply: scores and their gradients from bf16 q, k, v and
// g with f32 accumulation, the probabilities and dS rounded to bf16 for their products, the
// softmax, its statistics and dropout in f32. Blocks of query rows go through oneDNN's bf16
// GEMMs (native on AVX512_BF16 and AMX, widened to f32 elsewhere) on per-thread scratch, so
// no (Tq, Tk) array is ever held. Arrays and layouts as flash_attention_forward/backward's.
void gemm_forward(const Array& q, const Array& k, const Array& v, const FlashAttentionShape& s, Array& out,
                  Array& lse);
void gemm_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                   const Array& g, const FlashAttentionShape& s, Array& dq, Array& dk, Array& dv);

}  // namespace mt::cpu::attention
