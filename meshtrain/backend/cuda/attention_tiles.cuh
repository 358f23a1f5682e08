#pragma once
// The tensor-core attention kernels' problem and tiles (attention_tensor_core.cu): the block
// shape, the problem's parameters, key visibility and the padded-out keys' score, and the
// loads of 64-row operand tiles (from f32 or bf16 arrays) into shared memory.
#include <cuda_bf16.h>

#include <cfloat>
#include <initializer_list>
#include <type_traits>

#include "meshtrain/backend/attention.h"
#include "meshtrain/backend/cuda/attention_dropout.cuh"
#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/device_types.cuh"

namespace mt::cuda::attention_tiles {

constexpr int kRows = 64;         // query (key) rows per block, 16 per warp
constexpr int kCols = 64;         // keys (queries) per tile a block walks
constexpr int kWarps = kRows / 16;
constexpr int kBlockThreads = kWarps * 32;

template <class E>
__device__ inline E to_elem(float x);
template <>
__device__ inline float to_elem<float>(float x) {
  return x;
}
template <>
__device__ inline __nv_bfloat16 to_elem<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

struct Params {
  int64_t tq, tk;
  int d;
  float scale;
  bool causal;
  AttentionDropout dropout;
  const bool* key_mask;  // (mask_batches, Tk) or null
  int64_t heads, mask_batches;
  int64_t group;  // query heads per key/value head: query slice bh reads k/v slice bh / group
  bool vector_rows;  // every row starts 16-byte aligned and d fills whole 16-byte loads
  bool heads_inner;  // (B, T, H, D) arrays instead of (B, H, T, D)
  // Elements between a slice's rows: q and dQ (ldq); out and dO (ldo); k, v, dK and dV (ldk).
  // d, or heads inner H·D and Hkv·D (ldq and ldk more in a packed (B, T, H + 2·Hkv, D) projection).
  int64_t ldq, ldo, ldk;
};

// Where query slice bh (q, dQ), output slice bh (out, dO) and key/value slice kv (k, v, dK, dV)
// start: slices are contiguous (B, H, T, D) blocks, or heads-inner (B, T, H, D) columns whose
// rows are ldq / ldo / ldk apart.
__device__ inline int64_t slice_at(const Params& p, int64_t slice, int64_t heads, int64_t rows, int64_t ld) {
  return p.heads_inner ? (slice / heads) * rows * ld + (slice % heads) * p.d : slice * rows * p.d;
}
__device__ inline int64_t query_at(const Params& p, int64_t bh) { return slice_at(p, bh, p.heads, p.tq, p.ldq); }
__device__ inline int64_t output_at(const Params& p, int64_t bh) { return slice_at(p, bh, p.heads, p.tq, p.ldo); }
__device__ inline int64_t key_at(const Params& p, int64_t kv) {
  return slice_at(p, kv, p.heads / p.group, p.tk, p.ldk);
}

// Key j is visible to query i: inside the key range and the causal limit.
__device__ inline int64_t visible_keys(const Params& p, int64_t i) {
  if (i >= p.tq) return 0;
  return p.causal ? min(p.tk, i + (p.tk - p.tq) + 1) : p.tk;
}
__device__ inline const bool* mask_row(const Params& p, int64_t bh) {
  return p.key_mask ? p.key_mask + (p.mask_batches == 1 ? 0 : bh / p.heads) * p.tk : nullptr;
}
// How far the key tiles go for a block of query rows from q0 (through the last row's causal
// limit) and for its warp's 16 rows from wq0 (0 when they are all past Tq).
struct KeyEnds {
  int64_t block, warp;
};
__device__ inline KeyEnds key_ends(const Params& p, int64_t q0, int64_t wq0) {
  const int64_t last_row = min(p.tq, q0 + kRows) - 1;
  return {p.causal ? min(p.tk, last_row + (p.tk - p.tq) + 1) : p.tk,
          wq0 < p.tq ? visible_keys(p, min(p.tq - 1, wq0 + 15)) : 0};
}

// The score a padded-out key takes: the lowest finite float, as the composed form's where(),
// or 0 in a mask row with no unmasked key (it then attends uniformly; with the lowest float
// its log-sum-exp would round back to the lowest float and lose log(Tk), as on the CPU).
// Every thread of the block must call it (a barrier).
__device__ inline float masked_fill(const Params& p, const bool* mask) {
  if (!mask) return -FLT_MAX;
  int any = 0;
  for (int64_t j = threadIdx.x; j < p.tk && !any; j += blockDim.x) any = mask[j];
  return __syncthreads_or(any) ? -FLT_MAX : 0.0f;
}
// The scaled score of a visible key (`fill` for a padded-out one).
__device__ inline float visible_score(const bool* mask, int64_t j, float raw, float scale, float fill) {
  return mask && !mask[j] ? fill : raw * scale;
}

// An element of a global array (f32 or bf16) as an operand tile element: bf16 to bf16 and f32
// to f32 unchanged, f32 to bf16 rounded to nearest even.
template <class Elem, class In>
__device__ inline Elem elem_of(In x) {
  return to_elem<Elem>(to_f32(x));
}

// Rows r0 .. r0 + 64 of a (rows, d) matrix whose rows are `ld` elements apart into an operand
// tile, zeros past `rows` and d.
template <class Elem, int MaxD, int Ld, class In>
__device__ inline void load_rows(Elem* tile, const In* x, int64_t rows, int64_t r0, int d, int64_t ld) {
  for (int e = threadIdx.x; e < kRows * MaxD; e += kBlockThreads) {
    const int r = e / MaxD, c = e % MaxD;
    const int64_t row = r0 + r;
    tile[r * Ld + c] = row < rows && c < d ? elem_of<Elem>(x[row * ld + c]) : to_elem<Elem>(0.0f);
  }
}

// Elements of In in one 16-byte load.
template <class In>
constexpr int kVecElems = int(16 / sizeof(In));

// One 16-byte load of In elements into the tile at dst (16-byte aligned): a straight copy when
// the tile holds In's own format (f32 in f32 tiles, bf16 in bf16 tiles), else element by element.
template <class Elem, class In>
__device__ inline void store_vec(Elem* dst, const uint4& v) {
  constexpr bool same_format =
      std::is_same_v<Elem, In> || (std::is_same_v<Elem, __nv_bfloat16> && std::is_same_v<In, bf16_t>);
  if constexpr (same_format) {
    *reinterpret_cast<uint4*>(dst) = v;
  } else {
    In x[kVecElems<In>];
    memcpy(x, &v, sizeof(v));
#pragma unroll
    for (int u = 0; u < kVecElems<In>; ++u) dst[u] = elem_of<Elem>(x[u]);
  }
}

// Rows r0 .. r0 + 64 of two (rows, d) matrices whose rows are `lda` and `ldb` elements apart
// into two operand tiles, zeros past `rows` and d. With vector rows every thread issues all its
// 16-byte loads before it stores any: a tile costs one memory round trip, not one per element
// (the scalar loop's latency was most of the kernels' time).
template <class Elem, int MaxD, int Ld, class In>
__device__ inline void load_pair(Elem* ta, const In* xa, Elem* tb, const In* xb, int64_t rows, int64_t r0,
                                 int64_t lda, int64_t ldb, const Params& p) {
  if (!p.vector_rows) {
    load_rows<Elem, MaxD, Ld>(ta, xa, rows, r0, p.d, lda);
    load_rows<Elem, MaxD, Ld>(tb, xb, rows, r0, p.d, ldb);
    return;
  }
  constexpr int kW = kVecElems<In>, kVecs = MaxD / kW, kPerThread = kRows * kVecs / kBlockThreads;
  static_assert(MaxD % kW == 0 && kRows * kVecs % kBlockThreads == 0);
  uint4 a[kPerThread], b[kPerThread];
#pragma unroll
  for (int t = 0; t < kPerThread; ++t) {
    const int e = threadIdx.x + t * kBlockThreads, r = e / kVecs, c = e % kVecs;
    const int64_t row = r0 + r;
    const bool inside = row < rows && c * kW < p.d;  // d is a multiple of kW: all of a vector or none
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);  // 0.0 in f32 and in bf16
    a[t] = inside ? reinterpret_cast<const uint4*>(xa + row * lda)[c] : zero;
    b[t] = inside ? reinterpret_cast<const uint4*>(xb + row * ldb)[c] : zero;
  }
#pragma unroll
  for (int t = 0; t < kPerThread; ++t) {
    const int e = threadIdx.x + t * kBlockThreads, r = e / kVecs, c = kW * (e % kVecs);
    store_vec<Elem, In>(ta + r * Ld + c, a[t]);
    store_vec<Elem, In>(tb + r * Ld + c, b[t]);
  }
}

// 16-byte row loads need d to be a multiple of a load's elements and 16-byte aligned operands
// (then every row starts aligned too, heads-inner rows and packed heads being a multiple of d
// apart).
inline bool vector_rows(const kernels::FlashAttentionShape& s, size_t elem_bytes,
                        std::initializer_list<const Array*> operands) {
  if (s.d % int64_t(16 / elem_bytes) != 0) return false;
  for (const Array* a : operands)
    if (reinterpret_cast<uintptr_t>(a->raw()) % 16 != 0) return false;
  return true;
}

inline Params params_of(const kernels::FlashAttentionShape& s, bool vector) {
  return {s.tq,
          s.tk,
          int(s.d),
          s.scale,
          s.causal,
          attention_dropout(s.dropout_rate, s.dropout_key),
          s.key_mask,
          s.heads,
          s.mask_batches,
          s.group,
          vector,
          s.heads_inner,
          !s.heads_inner ? s.d : s.q_row_stride ? s.q_row_stride : s.heads * s.d,
          s.heads_inner ? s.heads * s.d : s.d,
          !s.heads_inner ? s.d : s.kv_row_stride ? s.kv_row_stride : s.heads / s.group * s.d};
}

}  // namespace mt::cuda::attention_tiles

