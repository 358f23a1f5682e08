#pragma once
// The tensor-core attention kernels' problem and tiles (attention_tensor_core.cu): the block
// shape, the problem's parameters, key visibility and the padded-out keys' score, and the
// loads of 64-row operand tiles into shared memory.
#include <cuda_bf16.h>

#include <cfloat>
#include <initializer_list>

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
  bool vector_rows;  // d is the kernel's MaxD and every row starts 16-byte aligned: float4 loads
};

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

// Rows r0 .. r0 + 64 of a (rows, d) f32 matrix into an operand tile, zeros past `rows` and d.
template <class Elem, int MaxD, int Ld>
__device__ inline void load_rows(Elem* tile, const float* x, int64_t rows, int64_t r0, int d) {
  for (int e = threadIdx.x; e < kRows * MaxD; e += kBlockThreads) {
    const int r = e / MaxD, c = e % MaxD;
    const int64_t row = r0 + r;
    tile[r * Ld + c] = to_elem<Elem>(row < rows && c < d ? x[row * d + c] : 0.0f);
  }
}

// Rows r0 .. r0 + 64 of two (rows, d) f32 matrices into two operand tiles. With vector rows
// every thread issues all its float4 loads before it stores any: a tile costs one memory
// round trip, not one per element (the scalar loop's latency was most of the kernels' time).
template <class Elem, int MaxD, int Ld>
__device__ inline void load_pair(Elem* ta, const float* xa, Elem* tb, const float* xb, int64_t rows, int64_t r0,
                                 const Params& p) {
  if (!p.vector_rows) {
    load_rows<Elem, MaxD, Ld>(ta, xa, rows, r0, p.d);
    load_rows<Elem, MaxD, Ld>(tb, xb, rows, r0, p.d);
    return;
  }
  constexpr int kVecs = MaxD / 4, kPerThread = kRows * kVecs / kBlockThreads;
  float4 a[kPerThread], b[kPerThread];
#pragma unroll
  for (int t = 0; t < kPerThread; ++t) {
    const int e = threadIdx.x + t * kBlockThreads, r = e / kVecs, c = e % kVecs;
    const int64_t row = r0 + r;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    a[t] = row < rows ? reinterpret_cast<const float4*>(xa + row * MaxD)[c] : zero;
    b[t] = row < rows ? reinterpret_cast<const float4*>(xb + row * MaxD)[c] : zero;
  }
#pragma unroll
  for (int t = 0; t < kPerThread; ++t) {
    const int e = threadIdx.x + t * kBlockThreads, r = e / kVecs, c = 4 * (e % kVecs);
    Elem* da = ta + r * Ld + c;
    Elem* db = tb + r * Ld + c;
    da[0] = to_elem<Elem>(a[t].x), da[1] = to_elem<Elem>(a[t].y), da[2] = to_elem<Elem>(a[t].z),
    da[3] = to_elem<Elem>(a[t].w);
    db[0] = to_elem<Elem>(b[t].x), db[1] = to_elem<Elem>(b[t].y), db[2] = to_elem<Elem>(b[t].z),
    db[3] = to_elem<Elem>(b[t].w);
  }
}

// float4 row loads need d to be the kernel's MaxD and 16-byte aligned rows in every operand.
inline bool vector_rows(const kernels::FlashAttentionShape& s, std::initializer_list<const Array*> operands) {
  if (s.d != 32 && s.d != 64) return false;
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
          vector};
}

}  // namespace mt::cuda::attention_tiles

