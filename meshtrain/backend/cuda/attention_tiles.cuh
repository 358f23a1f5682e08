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
  uint32_t* keep_bits;  // FlashAttentionShape::keep_bits (null: the backward draws its flags)
  int64_t key_tiles;    // ceil(Tk / 64): keep_bits' tiles per query row
  // Null, or per batch b a flag: the kernels run batch b's slices only where it is nonzero (the
  // cuDNN route hands them the batches its key-mask bias cannot give uniform rows:
  // cudnn_attention.cpp). Blocks of the other batches return before they read anything.
  const int32_t* only_batches;
};

__device__ inline bool batch_skipped(const Params& p, int64_t batch) {
  return p.only_batches && p.only_batches[batch] == 0;
}

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

// The score a padded-out key takes: kMaskedScore (backend/attention.h), or 0 in a mask row with
// no unmasked key (it then attends uniformly; with kMaskedScore its log-sum-exp would round
// back to kMaskedScore and lose log(Tk), as on the CPU).
// Every thread of the block must call it (a barrier).
__device__ inline float masked_fill(const Params& p, const bool* mask) {
  if (!mask) return kernels::kMaskedScore;
  int any = 0;
  for (int64_t j = threadIdx.x; j < p.tk && !any; j += blockDim.x) any = mask[j];
  return __syncthreads_or(any) ? kernels::kMaskedScore : 0.0f;
}
// The scaled score of a visible key (`fill` for a padded-out one), rounded before it is used:
// a plain product folded into the caller's next subtraction could become one fused multiply-add
// (nvcc's default), and these tiles would then differ in the last bit from the whole tiles and
// the CPU, which round the product first.
__device__ inline float visible_score(const bool* mask, int64_t j, float raw, float scale, float fill) {
  return mask && !mask[j] ? fill : __fmul_rn(raw, scale);
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

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// 16 bytes from global to shared memory without passing through registers (cp.async, sm_80+),
// or 16 zero bytes when `valid` is false (nothing is read then; src is any mapped address).
__device__ inline void copy16_async(void* dst, const void* src, bool valid) {
  const unsigned to = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src), "r"(valid ? 16 : 0));
}
// 4 bytes likewise (cp.async.ca: the sizes below 16 go through L1).
__device__ inline void copy4_async(void* dst, const void* src, bool valid) {
  const unsigned to = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to), "l"(src), "r"(valid ? 4 : 0));
}
__device__ inline void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `kPending` of this thread's committed copy groups are still in flight.
template <int kPending>
__device__ inline void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// load_pair's tiles by cp.async (the caller commits the group): the block computes on the
// previous tile while these land. Needs vector rows and arrays already in the tiles' format
// (bf16 in bf16 tiles): the bytes are copied as they are.
template <class Elem, int MaxD, int Ld, class In>
__device__ inline void load_pair_async(Elem* ta, const In* xa, Elem* tb, const In* xb, int64_t rows, int64_t r0,
                                       int64_t lda, int64_t ldb, const Params& p) {
  static_assert(sizeof(Elem) == sizeof(In), "cp.async copies the arrays' bytes into the tiles as they are");
  constexpr int kW = kVecElems<In>, kVecs = MaxD / kW, kPerThread = kRows * kVecs / kBlockThreads;
  static_assert(MaxD % kW == 0 && kRows * kVecs % kBlockThreads == 0);
  // 32-bit offsets inside the tile (take_pipelined() checks that 64 rows' offsets fit): 64-bit
  // addresses per copy cost the kernels registers they need for their fragments.
  const In* a0 = xa + r0 * lda;
  const In* b0 = xb + r0 * ldb;
  const int valid_rows = int(min(rows - r0, int64_t(kRows)));
#pragma unroll
  for (int t = 0; t < kPerThread; ++t) {
    const int e = threadIdx.x + t * kBlockThreads, r = e / kVecs, c = kW * (e % kVecs);
    const bool inside = r < valid_rows && c < p.d;  // d is a multiple of kW: all of a vector or none
    copy16_async(ta + r * Ld + c, inside ? a0 + (r * int(lda) + c) : xa, inside);
    copy16_async(tb + r * Ld + c, inside ? b0 + (r * int(ldb) + c) : xb, inside);
  }
}

// The key and value tiles a forward or dQ block walks, 64 keys at a time, from `base` in shared
// memory. Single-buffered (kPipelined false): each tile is loaded between two barriers, the
// whole block waiting on the loads. Double-buffered (true, load_pair_async's arrays): the next
// tile's copy is in flight while the block computes on this one, the loads hold no registers
// (the staging of load_pair took 32 of a thread's), and a tile costs one barrier: after it,
// tile `it` has landed and every warp is done with tile it - 1, whose buffer the copy of tile
// it + 1 then refills.
template <class Elem, int MaxD, int Ld, bool kPipelined, class In>
struct KeyValueTiles {
  static constexpr size_t kTileBytes = size_t(kRows) * Ld * sizeof(Elem);
  static constexpr int kBuffers = kPipelined ? 2 : 1;
  static constexpr size_t kBytes = 2 * kBuffers * kTileBytes;
  unsigned char* base;
  const In *k, *v;
  const Params& p;
  int64_t end;  // past the block's last key tile

  __device__ Elem* key_tile(int64_t it) const {
    return reinterpret_cast<Elem*>(base + 2 * (kPipelined ? it & 1 : 0) * kTileBytes);
  }
  __device__ Elem* value_tile(int64_t it) const { return key_tile(it) + kTileBytes / sizeof(Elem); }
  __device__ void copy(int64_t it, int64_t j0) const {
    load_pair_async<Elem, MaxD, Ld>(key_tile(it), k, value_tile(it), v, p.tk, j0, p.ldk, p.ldk, p);
    commit_copies();
  }
  // Starts the first tile's copy (double-buffered); every thread of the block calls it.
  __device__ void start() const {
    if constexpr (kPipelined)
      if (end > 0) copy(0, 0);
  }
  // Tile `it` (keys from j0) is in key_tile(it) and value_tile(it) for every thread after this
  // (a barrier: every thread of the block calls it, at the top of each tile's iteration).
  __device__ void ready(int64_t it, int64_t j0) const {
    if constexpr (kPipelined) {
      wait_copies<0>();
      __syncthreads();
      if (j0 + kCols < end) copy(it + 1, j0 + kCols);
    } else {
      __syncthreads();  // every warp is done with the previous tile
      load_pair<Elem, MaxD, Ld>(key_tile(it), k, value_tile(it), v, p.tk, j0, p.ldk, p.ldk, p);
      __syncthreads();
    }
  }
};

// The query-side tiles a dK/dV block walks: for each query head of its group, the q and dO
// tiles of 64 queries from `first` on, with those queries' log-sum-exps and D values, in the
// order (head, tile). Single-buffered or double-buffered by cp.async, as KeyValueTiles. A
// buffer: q tile, dO tile, 64 log-sum-exps, 64 D values.
template <class Elem, int MaxD, int Ld, bool kPipelined, class In>
struct QueryTiles {
  static constexpr size_t kTileBytes = size_t(kRows) * Ld * sizeof(Elem);
  static constexpr size_t kBufferBytes = 2 * kTileBytes + 2 * kCols * sizeof(float);
  static constexpr size_t kBytes = (kPipelined ? 2 : 1) * kBufferBytes;
  static_assert(kBufferBytes % 16 == 0 && kBlockThreads == 2 * kCols);
  unsigned char* base;
  const In *q, *g_out;
  const float *lse, *dvec;
  const Params& p;
  int64_t kv;     // the key/value slice: its query heads are kv·group ...
  int64_t first;  // the first tile's first query (a multiple of 64)
  int64_t per_head;  // tiles per query head

  __device__ int64_t count() const { return p.group * per_head; }
  __device__ int64_t head(int64_t it) const { return kv * p.group + it / per_head; }
  __device__ int64_t first_query(int64_t it) const { return first + (it % per_head) * kCols; }
  __device__ unsigned char* buffer(int64_t it) const { return base + (kPipelined ? it & 1 : 0) * kBufferBytes; }
  __device__ Elem* q_tile(int64_t it) const { return reinterpret_cast<Elem*>(buffer(it)); }
  __device__ Elem* g_tile(int64_t it) const { return reinterpret_cast<Elem*>(buffer(it) + kTileBytes); }
  __device__ float* lse_of(int64_t it) const { return reinterpret_cast<float*>(buffer(it) + 2 * kTileBytes); }
  __device__ float* dvec_of(int64_t it) const { return lse_of(it) + kCols; }

  // Tile it's copies, as one committed group (double-buffered).
  __device__ void copy(int64_t it) const {
    const int64_t bh = head(it), i0 = first_query(it);
    load_pair_async<Elem, MaxD, Ld>(q_tile(it), q + query_at(p, bh), g_tile(it), g_out + output_at(p, bh), p.tq, i0,
                                    p.ldq, p.ldo, p);
    // One row statistic per thread: the first 64 threads the log-sum-exps, the next 64 the D values.
    const int e = int(threadIdx.x) % kCols;
    const bool inside = i0 + e < p.tq;
    const float* src = threadIdx.x < kCols ? lse : dvec;
    float* dst = threadIdx.x < kCols ? lse_of(it) : dvec_of(it);
    copy4_async(dst + e, inside ? src + bh * p.tq + i0 + e : src, inside);
    commit_copies();
  }
  __device__ void start() const {
    if constexpr (kPipelined)
      if (count() > 0) copy(0);
  }
  // Tile `it` is in its buffer for every thread after this (a barrier for the whole block, at
  // the top of each tile's iteration; then the next tile's copy, as KeyValueTiles::ready).
  __device__ void ready(int64_t it) const {
    if constexpr (kPipelined) {
      wait_copies<0>();
      __syncthreads();
      if (it + 1 < count()) copy(it + 1);
    } else {
      __syncthreads();  // every warp is done with the previous tile
      const int64_t bh = head(it), i0 = first_query(it);
      load_pair<Elem, MaxD, Ld>(q_tile(it), q + query_at(p, bh), g_tile(it), g_out + output_at(p, bh), p.tq, i0,
                                p.ldq, p.ldo, p);
      for (int e = threadIdx.x; e < kCols; e += kBlockThreads) {
        lse_of(it)[e] = i0 + e < p.tq ? lse[bh * p.tq + i0 + e] : 0.0f;
        dvec_of(it)[e] = i0 + e < p.tq ? dvec[bh * p.tq + i0 + e] : 0.0f;
      }
      __syncthreads();
    }
  }
};
#endif

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
          !s.heads_inner ? s.d : s.kv_row_stride ? s.kv_row_stride : s.heads / s.group * s.d,
          s.keep_bits,
          (s.tk + kCols - 1) / kCols,
          nullptr};
}

}  // namespace mt::cuda::attention_tiles

