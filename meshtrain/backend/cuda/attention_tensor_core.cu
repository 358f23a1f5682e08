// Fused (flash-style) attention, forward and backward, for f32 and bf16 arrays with head dims
// up to 128, on tensor cores through mma.sync with register-resident fragments (the
// FlashAttention-2 arrangement): in the forward each warp keeps its 16 rows' q fragments,
// scores, probabilities and output accumulators in registers, where the thread/element layout
// of mma.sync is known, so the online softmax rescales the output in place and the scores
// become the next product's operand without a trip through shared memory. The tiles a block
// walks (keys and values, or queries and output gradients) pass through shared memory, as do
// the backward's second own operand (dO, or v), read at each k step.
//
// mma.sync fragments (g = lane / 4, t = lane % 4), m16n8k8 TF32 and m16n8k16 bf16:
//   C (16 x 8):  c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
//   A TF32:      a0 (g, t),  a1 (g+8, t),  a2 (g, t+4),  a3 (g+8, t+4)
//   B TF32:      b0 (t, g),  b1 (t+4, g)
//   A bf16:      a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..2t+9), a3 (g+8, 2t+8..)
//   B bf16:      b0 (2t..2t+1, g), b1 (2t+8..2t+9, g)
// A C tile becomes an A operand of the next product (whose k runs over C's columns) as is for
// bf16; for TF32 the k index is permuted (k t <-> column 2t, k t+4 <-> column 2t+1), and the
// next product's B rows are read in the same permuted order, which leaves the sum unchanged.
//
// Operands: bf16 arrays multiply as they are (bf16 products, f32 accumulation and softmax,
// the probabilities rounded to bf16 for the product with v, as the composed form's bf16
// probabilities are); f32 arrays follow --precision: bf16, TF32, or f32-accurate as three TF32
// products per pair (hi·hi + hi·lo + lo·hi). Outputs and gradients are written in the arrays'
// dtype, the row log-sum-exps in f32. The scalar kernels (attention.cu) remain for f16 arrays
// and for GPUs (or builds) before sm_80, where mma.sync has no TF32/bf16 shapes.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "meshtrain/backend/cuda/attention_keep_lanes.h"
#include "meshtrain/backend/cuda/attention_tiles.cuh"
#include "meshtrain/backend/attention.h"

namespace mt::cuda {

namespace {

using namespace attention_tiles;

struct F32Ops {
  using Elem = float;
  static constexpr int kK = 8, kPad = 4;
  static constexpr bool kTf32 = true, kSplit = true;
};
struct Tf32Ops {
  using Elem = float;
  static constexpr int kK = 8, kPad = 4;
  static constexpr bool kTf32 = true, kSplit = false;
};
struct Bf16Ops {
  using Elem = __nv_bfloat16;
  static constexpr int kK = 16, kPad = 8;
  static constexpr bool kTf32 = false;
};

// A register operand element: an f32 value (rounded to TF32 at the product) or two packed bf16.
template <class Ops>
using Val = std::conditional_t<Ops::kTf32, float, uint32_t>;

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
__device__ inline uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo in the low half: the lower k
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ inline void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// e^x as __expf computes it, 2^(x · log2 e) on the special function unit, with results below
// 2^-126 flushed to zero: __expf keeps them (without -ftz) by a compare and two multiplies
// around each exponential, and no probability that small changes a sum it enters.
__device__ inline float exp_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504f));
  return y;
}

// c += a · b in the operand precision of Ops.
template <class Ops>
__device__ inline void mma(float (&c)[4], const Val<Ops> (&a)[4], const Val<Ops> (&b)[2]) {
  if constexpr (Ops::kTf32) {
    uint32_t ah[4], bh[2];
#pragma unroll
    for (int e = 0; e < 4; ++e) ah[e] = tf32_bits(a[e]);
    bh[0] = tf32_bits(b[0]), bh[1] = tf32_bits(b[1]);
    if constexpr (Ops::kSplit) {
      uint32_t al[4], bl[2];
#pragma unroll
      for (int e = 0; e < 4; ++e) al[e] = tf32_bits(a[e] - __uint_as_float(ah[e]));
      bl[0] = tf32_bits(b[0] - __uint_as_float(bh[0])), bl[1] = tf32_bits(b[1] - __uint_as_float(bh[1]));
      mma_tf32(c, al, bh);
      mma_tf32(c, ah, bl);
    }
    mma_tf32(c, ah, bh);
  } else {
    mma_bf16(c, a, b);
  }
}

__device__ inline uint32_t word_at(const typename Bf16Ops::Elem* t, int offset) {
  return *reinterpret_cast<const uint32_t*>(t + offset);
}

// A operand, k step at column k0, of the 16 rows r0.. of a shared-memory tile (row-major, ld).
template <class Ops>
__device__ inline void load_a(Val<Ops> (&a)[4], const typename Ops::Elem* t, int ld, int r0, int k0, int g, int q) {
  if constexpr (Ops::kTf32) {
    a[0] = t[(r0 + g) * ld + k0 + q], a[1] = t[(r0 + g + 8) * ld + k0 + q];
    a[2] = t[(r0 + g) * ld + k0 + q + 4], a[3] = t[(r0 + g + 8) * ld + k0 + q + 4];
  } else {
    a[0] = word_at(t, (r0 + g) * ld + k0 + 2 * q), a[1] = word_at(t, (r0 + g + 8) * ld + k0 + 2 * q);
    a[2] = word_at(t, (r0 + g) * ld + k0 + 2 * q + 8), a[3] = word_at(t, (r0 + g + 8) * ld + k0 + 2 * q + 8);
  }
}
// Two 8 x 8 bf16 matrices of a shared-memory tile in mma fragment order, one instruction:
// lanes 0-7 give the row addresses of the first, lanes 8-15 those of the second (16-byte
// aligned: tile rows are a multiple of 16 bytes long, and matrices start at multiples of 8
// columns). Plain, lane l receives (row l/4, columns 2(l%4), 2(l%4)+1) of each; transposed,
// (rows 2(l%4), 2(l%4)+1, column l/4): the B fragment of m16n8k16 either way round.
template <bool kTrans>
__device__ inline void ldmatrix_x2(uint32_t (&r)[2], const __nv_bfloat16* row_address) {
  const unsigned a = unsigned(__cvta_generic_to_shared(row_address));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

// B operand of a · tileᵀ: B[k][n] = tile[n0 + n][k0 + k]. bf16: the 8 x 8 blocks at columns
// k0 and k0 + 8 of rows n0.., read as they are stored.
template <class Ops>
__device__ inline void load_bt(Val<Ops> (&b)[2], const typename Ops::Elem* t, int ld, int n0, int k0, int g, int q) {
  if constexpr (Ops::kTf32) {
    b[0] = t[(n0 + g) * ld + k0 + q], b[1] = t[(n0 + g) * ld + k0 + q + 4];
  } else {
    const int lane = 4 * g + q;
    ldmatrix_x2<false>(b, t + (n0 + lane % 8) * ld + k0 + 8 * ((lane / 8) % 2));
  }
}
// B operand of a · tile for an a made from a C tile (c_to_a): B[k][n] = tile[k0 + k'][n0 + n]
// with k' the C column behind k (permuted for TF32). bf16: the 8 x 8 blocks at rows k0 and
// k0 + 8 of columns n0.., transposed on the way (four 16-bit loads and two packs before).
template <class Ops>
__device__ inline void load_b(Val<Ops> (&b)[2], const typename Ops::Elem* t, int ld, int k0, int n0, int g, int q) {
  if constexpr (Ops::kTf32) {
    b[0] = t[(k0 + 2 * q) * ld + n0 + g], b[1] = t[(k0 + 2 * q + 1) * ld + n0 + g];
  } else {
    const int lane = 4 * g + q;
    ldmatrix_x2<true>(b, t + (k0 + lane % 16) * ld + n0);
  }
}
// The A operand, k step kk, of a product whose k runs over the columns of C tiles c[n].
template <class Ops, int N>
__device__ inline void c_to_a(Val<Ops> (&a)[4], const float (&c)[N][4], int kk) {
  if constexpr (Ops::kTf32) {
    a[0] = c[kk][0], a[1] = c[kk][2], a[2] = c[kk][1], a[3] = c[kk][3];
  } else {
    a[0] = pack_bf16(c[2 * kk][0], c[2 * kk][1]), a[1] = pack_bf16(c[2 * kk][2], c[2 * kk][3]);
    a[2] = pack_bf16(c[2 * kk + 1][0], c[2 * kk + 1][1]), a[3] = pack_bf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

// The dropout verdicts of this lane's fragment of a warp's 16 x 64 block of the (BH, Tq, Tk)
// array, element (r, c) at idx0 + r·stride + c (the forward and dQ: rows are queries), as
// attention_keep_lanes.h lays them out: where rows start on a Philox block, 8 blocks per lane
// and one shuffle between lane pairs (the shared-memory flags of before cost each element a
// byte stored and loaded); else one draw per element. Every verdict kept without dropout.
__device__ inline keep_lanes::FragmentKeeps draw_keeps_by_rows(const AttentionDropout& dr, int64_t idx0,
                                                               int64_t stride, int lane) {
  using namespace keep_lanes;
  FragmentKeeps k;
  if (!dr.on) {
    k.row[0] = k.row[1] = 0xffffu;
  } else if (idx0 % 4 == 0 && stride % 4 == 0) {
    uint32_t own = 0, passed = 0;
    const int64_t row_start = idx0 + drawn_row(lane) * stride;
#pragma unroll 2
    for (int i = 0; i < 8; ++i) {
      uint32_t w[4];
      philox_block(uint64_t(row_start + drawn_column(lane, i)) / 4, dr.seed, dr.stream_id, w);
      uint32_t four = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) four |= uint32_t(keeps_word(w[j], dr.keep_from)) << j;
      split_block(four, lane, i, own, passed);
    }
    k = assemble(lane, own, __shfl_xor_sync(0xffffffffu, passed, 1));
  } else {
#pragma unroll 1
    for (int n = 0; n < 8; ++n)
#pragma unroll 1
      for (int e = 0; e < 4; ++e)
        set_kept(k, n, e, keep_factor(dr, idx0 + element_row(lane, e) * stride + element_column(lane, n, e)) != 0.0f);
  }
  return k;
}
// Word `half` of the keep bits of (slice bh, query row i, the key tile from j): tile-major, so
// that a warp's 16 rows (forward, dQ) and a tile's 64 queries (dK/dV) are contiguous words.
__device__ inline int64_t keep_word(const Params& p, int64_t bh, int64_t i, int64_t j, int half) {
  return ((bh * p.key_tiles + j / kCols) * p.tq + i) * 2 + half;
}
// The forward's verdicts of a warp's block (query rows from wq0, keys from j0) as bits for the
// backward (FlashAttentionShape::keep_bits): the four lanes of a row gather each of its two
// words by two shuffles, and lane t writes row g + 8(t / 2)'s half t % 2.
__device__ inline void store_keeps(const keep_lanes::FragmentKeeps& k, const Params& p, int64_t bh, int64_t wq0,
                                   int64_t j0, int lane) {
  uint32_t words[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t w = keep_lanes::row_half_part(k, lane, h, half);
      w |= __shfl_xor_sync(0xffffffffu, w, 1);
      words[h][half] = w | __shfl_xor_sync(0xffffffffu, w, 2);
    }
  const int h = (lane % 4) / 2, half = keep_lanes::stored_half(lane);
  const uint32_t mine = h ? (half ? words[1][1] : words[1][0]) : (half ? words[0][1] : words[0][0]);
  const int64_t i = wq0 + keep_lanes::stored_row(lane);
  if (i < p.tq) p.keep_bits[keep_word(p, bh, i, j0, half)] = mine;
}
// The dQ kernel's verdicts of a warp's block read back from those bits.
__device__ inline keep_lanes::FragmentKeeps load_keeps_by_rows(const Params& p, int64_t bh, int64_t wq0, int64_t j0,
                                                               int lane) {
  keep_lanes::FragmentKeeps k;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t i = wq0 + lane / 4 + 8 * h;
    if (i >= p.tq) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half)
      keep_lanes::set_row_half(k, lane, h, half, p.keep_bits[keep_word(p, bh, i, j0, half)]);
  }
  return k;
}
// The dK/dV kernel's verdicts of a warp's 16 keys (rows, from wk0) by 64 queries (columns,
// from i0), element (r, c) at idx0 + c·stride + r: where rows start on a Philox block, 8 draws
// per lane and four shuffles within its group of four lanes (attention_keep_lanes.h, the
// transposed blocks); else one draw per element. Every verdict kept without dropout.
__device__ inline keep_lanes::ColumnKeeps draw_keeps_by_columns(const AttentionDropout& dr, int64_t idx0,
                                                                int64_t stride, int lane) {
  using namespace keep_lanes;
  ColumnKeeps k;
  if (!dr.on) {
    k.bits = ~0u;
  } else if (idx0 % 4 == 0 && stride % 4 == 0) {
    uint32_t word = 0;
#pragma unroll 2
    for (int i = 0; i < 8; ++i) {
      uint32_t w[4];
      philox_block(uint64_t(idx0 + column_drawn_column(lane, i) * stride + column_drawn_row(lane, i)) / 4, dr.seed,
                   dr.stream_id, w);
#pragma unroll
      for (int j = 0; j < 4; ++j) word |= uint32_t(keeps_word(w[j], dr.keep_from)) << (4 * i + j);
    }
#pragma unroll
    for (int src = 0; src < 4; ++src)
      k.bits |= column_bits_from(lane, src, __shfl_sync(0xffffffffu, word, column_source_lane(lane, src)));
  } else {
#pragma unroll 1
    for (int n = 0; n < 8; ++n)
#pragma unroll 1
      for (int e = 0; e < 4; ++e)
        set_kept(k, n, e, keep_factor(dr, idx0 + element_column(lane, n, e) * stride + element_row(lane, e)) != 0.0f);
  }
  return k;
}
// The dK/dV kernel's verdicts read back from the forward's bits: query i0 + c's word holds
// the bits of keys wk0 .. wk0 + 15 (wk0 is a multiple of 16), of which the lane's rows are
// bits g and g + 8.
__device__ inline keep_lanes::ColumnKeeps load_keeps_by_columns(const Params& p, int64_t bh, int64_t i0, int64_t wk0,
                                                                int lane) {
  keep_lanes::ColumnKeeps k;
  const int half = keep_lanes::column_word_half(wk0), shift = keep_lanes::column_word_shift(wk0, lane);
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int64_t i = i0 + keep_lanes::element_column(lane, n, b);
      const uint32_t bits = i < p.tq ? p.keep_bits[keep_word(p, bh, i, wk0, half)] >> shift : 0u;
      keep_lanes::set_kept(k, n, b, bits & 1u);
      keep_lanes::set_kept(k, n, 2 + b, (bits >> 8) & 1u);
    }
  return k;
}
// The factor fragment element (n, e)'s probability takes: 1 / (1 - rate) kept, 0 dropped;
// without dropout the draw keeps everything and the scale is 1.
template <class Keeps>
__device__ inline float keep_scale(const AttentionDropout& dr, const Keeps& k, int n, int e) {
  return keep_lanes::kept(k, n, e) ? dr.scale : 0.0f;
}
#endif

template <class Ops, int MaxD>
struct Shape {
  static constexpr int kLd = MaxD + Ops::kPad;  // operand tile rows in shared memory
  static constexpr int kSteps = MaxD / Ops::kK;  // k steps over the head dim
  static constexpr int kKeySteps = kCols / Ops::kK;  // k steps over a tile's 64 columns
  static constexpr int kN = kCols / 8, kDN = MaxD / 8;  // 8-wide C tiles across a tile, across d
  static constexpr size_t kTile = size_t(kRows) * kLd * sizeof(typename Ops::Elem);
  static_assert(kTile % 16 == 0);
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// The backward's two score-shaped products over the head dim, in one k loop: s += a·xᵀ with
// a's fragments in registers, dp += (the warp's 16 rows of b_rows)·yᵀ with b's fragments read
// from shared memory at each step (both in registers spill the f32 kernels).
template <class Ops, int MaxD>
__device__ inline void score_pair(float (&s)[Shape<Ops, MaxD>::kN][4], float (&dp)[Shape<Ops, MaxD>::kN][4],
                                  const Val<Ops> (&a)[Shape<Ops, MaxD>::kSteps][4], const typename Ops::Elem* b_rows,
                                  const typename Ops::Elem* x, const typename Ops::Elem* y, int warp, int g, int t) {
  using S = Shape<Ops, MaxD>;
#pragma unroll
  for (int st = 0; st < S::kSteps; ++st) {
    Val<Ops> b[4];
    load_a<Ops>(b, b_rows, S::kLd, warp * 16, st * Ops::kK, g, t);
#pragma unroll
    for (int n = 0; n < S::kN; ++n) {
      Val<Ops> bx[2];
      load_bt<Ops>(bx, x, S::kLd, n * 8, st * Ops::kK, g, t);
      mma<Ops>(s[n], a[st], bx);
      load_bt<Ops>(bx, y, S::kLd, n * 8, st * Ops::kK, g, t);
      mma<Ops>(dp[n], b, bx);
    }
  }
}

// acc[n] += c · tile over a tile's 64 columns: c's C tiles become the A operand (c_to_a) and
// the tile's rows (keys or queries) the k dimension; n runs over 8-wide column groups of d.
template <class Ops, int MaxD>
__device__ inline void accumulate_product(float (&acc)[Shape<Ops, MaxD>::kDN][4], const float (&c)[Shape<Ops, MaxD>::kN][4],
                                          const typename Ops::Elem* tile, int g, int t) {
  using S = Shape<Ops, MaxD>;
#pragma unroll
  for (int kk = 0; kk < S::kKeySteps; ++kk) {
    Val<Ops> a[4];
    c_to_a<Ops>(a, c, kk);
#pragma unroll
    for (int n = 0; n < S::kDN; ++n) {
      Val<Ops> b[2];
      load_b<Ops>(b, tile, S::kLd, kk * Ops::kK, n * 8, g, t);
      mma<Ops>(acc[n], a, b);
    }
  }
}

// Row r (the thread's row g, h = 0, or g + 8, h = 1) of a warp's (16, d) result, times
// `factor`, into dst (the row's first element).
template <int DN, class Out>
__device__ inline void store_row(Out* dst, const float (&acc)[DN][4], int h, int d, int t, float factor) {
#pragma unroll
  for (int n = 0; n < DN; ++n) {
    const int c = n * 8 + 2 * t;
    if (c < d) dst[c] = from_f32<Out>(acc[n][2 * h] * factor);
    if (c + 1 < d) dst[c + 1] = from_f32<Out>(acc[n][2 * h + 1] * factor);
  }
}
#endif

// The query tile a (forward or dQ) block takes: the last tiles first. Under a causal mask they
// see the most keys, and a grid whose heaviest blocks started last ended on a wave of them
// with most of the GPU idle.
__device__ inline int64_t last_first_tile() { return int64_t(gridDim.y - 1 - blockIdx.y); }

// This thread's two rows (whose visible keys end at limits) see the whole key tile from j0,
// and there is no padding mask: its scores need no per-element visibility test. Only tiles
// across the causal diagonal or past Tk (or rows past Tq) take the test.
__device__ inline bool whole_key_tile(const bool* mask, int64_t j0, const int64_t (&limits)[2]) {
  return !mask && j0 + kCols <= min(limits[0], limits[1]);
}

// ---- forward ----
// Block: (batch·head, 64 query rows); warp: 16 rows, whose q fragments stay in registers.
// Shared memory: the q tile and the key/value tiles (KeyValueTiles).
template <class Ops, int MaxD, class In, bool kPipelined = false>
__global__ void __launch_bounds__(kBlockThreads) mma_forward_kernel(const In* q, const In* k, const In* v, In* out,
                                                                    float* lse, Params p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  if (batch_skipped(p, int64_t(blockIdx.x) / p.heads)) return;
  fold_last_in(p.dropout);
  using S = Shape<Ops, MaxD>;
  using Elem = typename Ops::Elem;
  using Tiles = KeyValueTiles<Elem, MaxD, S::kLd, kPipelined, In>;
  extern __shared__ __align__(128) unsigned char smem[];
  Elem* qs = reinterpret_cast<Elem*>(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t bh = blockIdx.x, q0 = last_first_tile() * kRows, wq0 = q0 + warp * 16;

  const int64_t kv = bh / p.group;  // the key/value slice this query head reads
  const KeyEnds ends = key_ends(p, q0, wq0);
  const Tiles tiles{smem + S::kTile, k + key_at(p, kv), v + key_at(p, kv), p, ends.block};
  tiles.start();  // the first key tile's copy runs under the q tile's load
  load_rows<Elem, MaxD, S::kLd>(qs, q + query_at(p, bh), p.tq, q0, p.d, p.ldq);
  __syncthreads();
  Val<Ops> qa[S::kSteps][4];
#pragma unroll
  for (int st = 0; st < S::kSteps; ++st) load_a<Ops>(qa[st], qs, S::kLd, warp * 16, st * Ops::kK, g, t);

  const int64_t rows[2] = {wq0 + g, wq0 + g + 8};
  const int64_t limits[2] = {visible_keys(p, rows[0]), visible_keys(p, rows[1])};
  const bool* mask = mask_row(p, bh);
  const float fill = masked_fill(p, mask);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[S::kDN][4] = {};
  for (int64_t j0 = 0, it = 0; j0 < ends.block; j0 += kCols, ++it) {
    tiles.ready(it, j0);
    if (j0 >= ends.warp) continue;  // past this warp's rows' keys (causal)
    const Elem* ks = tiles.key_tile(it);
    const Elem* vs = tiles.value_tile(it);
    // The verdicts first, while the scores hold no registers (drawn after them, the draws'
    // temporaries took the dQ kernel at d 64 from 168 registers to 230: 2 blocks per SM, not 3).
    keep_lanes::FragmentKeeps keeps;
    if (p.dropout.on) {
      keeps = draw_keeps_by_rows(p.dropout, (bh * p.tq + wq0) * p.tk + j0, p.tk, lane);
      if (p.keep_bits) store_keeps(keeps, p, bh, wq0, j0, lane);
    }
    float s[S::kN][4] = {};
#pragma unroll
    for (int st = 0; st < S::kSteps; ++st)
#pragma unroll
      for (int n = 0; n < S::kN; ++n) {
        Val<Ops> b[2];
        load_bt<Ops>(b, ks, S::kLd, n * 8, st * Ops::kK, g, t);
        mma<Ops>(s[n], qa[st], b);
      }
    float mx[2] = {-INFINITY, -INFINITY};
    // Two loops, not one test per element: the test's mask read kept the compiler from
    // straightening the whole tiles' elements (each cost three branches).
    if (whole_key_tile(mask, j0, limits)) {
#pragma unroll
      for (int n = 0; n < S::kN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] = __fmul_rn(s[n][e], p.scale);  // rounded as on the other tiles: no fused multiply-add
          mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
        }
    } else {
#pragma unroll
      for (int n = 0; n < S::kN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + 2 * t + (e & 1);
          s[n][e] = j0 + c < limits[e / 2] ? visible_score(mask, j0 + c, s[n][e], p.scale, fill) : -INFINITY;
          mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
        }
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m[h], mx[h]);
      alpha[h] = m[h] == -INFINITY ? 0.0f : exp_ftz(m[h] - m_new);
      m[h] = m_new;
      l[h] *= alpha[h];
    }
#pragma unroll
    for (int n = 0; n < S::kDN; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    // A row with no visible score yet (m = -inf) exponentiates its -inf scores from 0: to 0,
    // with no test per element.
    const float m_base[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
#pragma unroll
    for (int n = 0; n < S::kN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float ex = exp_ftz(s[n][e] - m_base[e / 2]);
        l[e / 2] += ex;
        s[n][e] = ex;
      }
    if (p.dropout.on) {
#pragma unroll
      for (int n = 0; n < S::kN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= keep_scale(p.dropout, keeps, n, e);
    }
    accumulate_product<Ops, MaxD>(o, s, vs, g, t);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (rows[h] >= p.tq) continue;
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;  // no keys at all (Tk = 0): zeros, as the CPU
    store_row(out + output_at(p, bh) + rows[h] * p.ldo, o, h, p.d, t, inv);
    if (t == 0) lse[bh * p.tq + rows[h]] = m[h] + logf(l[h]);
  }
#endif
}

// ---- backward: dQ ----
// Block: (batch·head, 64 query rows); warp: 16 rows, q fragments in registers (dO's read from
// shared memory at each k step); walks
// the key tiles they see: s = q·kᵀ, dP = dO·vᵀ, dS, dQ += dS·k.
// Shared memory: the q and dO tiles and the key/value tiles (KeyValueTiles).
template <class Ops, int MaxD, class In, bool kPipelined = false>
__global__ void __launch_bounds__(kBlockThreads)
    mma_backward_q_kernel(const In* q, const In* k, const In* v, const In* g_out, const float* lse, const float* dvec,
                          In* dq, Params p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  if (batch_skipped(p, int64_t(blockIdx.x) / p.heads)) return;
  fold_last_in(p.dropout);
  using S = Shape<Ops, MaxD>;
  using Elem = typename Ops::Elem;
  using Tiles = KeyValueTiles<Elem, MaxD, S::kLd, kPipelined, In>;
  extern __shared__ __align__(128) unsigned char smem[];
  Elem* qs = reinterpret_cast<Elem*>(smem);
  Elem* gs = reinterpret_cast<Elem*>(smem + S::kTile);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t bh = blockIdx.x, q0 = last_first_tile() * kRows, wq0 = q0 + warp * 16;

  const int64_t kv = bh / p.group;  // the key/value slice this query head reads
  const KeyEnds ends = key_ends(p, q0, wq0);
  const Tiles tiles{smem + 2 * S::kTile, k + key_at(p, kv), v + key_at(p, kv), p, ends.block};
  tiles.start();  // the first key tile's copy runs under the q and dO tiles' loads
  load_pair<Elem, MaxD, S::kLd>(qs, q + query_at(p, bh), gs, g_out + output_at(p, bh), p.tq, q0, p.ldq, p.ldo,
                                p);
  __syncthreads();
  Val<Ops> qa[S::kSteps][4];
#pragma unroll
  for (int st = 0; st < S::kSteps; ++st) load_a<Ops>(qa[st], qs, S::kLd, warp * 16, st * Ops::kK, g, t);
  const int64_t rows[2] = {wq0 + g, wq0 + g + 8};
  const int64_t limits[2] = {visible_keys(p, rows[0]), visible_keys(p, rows[1])};
  float row_lse[2], row_d[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_lse[h] = rows[h] < p.tq ? lse[bh * p.tq + rows[h]] : 0.0f;
    row_d[h] = rows[h] < p.tq ? dvec[bh * p.tq + rows[h]] : 0.0f;
  }
  const bool* mask = mask_row(p, bh);
  const float fill = masked_fill(p, mask);
  float dqa[S::kDN][4] = {};
  for (int64_t j0 = 0, it = 0; j0 < ends.block; j0 += kCols, ++it) {
    tiles.ready(it, j0);
    if (j0 >= ends.warp) continue;  // past this warp's rows' keys (causal)
    const Elem* ks = tiles.key_tile(it);
    const Elem* vs = tiles.value_tile(it);
    float s[S::kN][4] = {}, dp[S::kN][4] = {};
    const keep_lanes::FragmentKeeps keeps =
        p.dropout.on && p.keep_bits ? load_keeps_by_rows(p, bh, wq0, j0, lane)
                                    : draw_keeps_by_rows(p.dropout, (bh * p.tq + wq0) * p.tk + j0, p.tk, lane);
    score_pair<Ops, MaxD>(s, dp, qa, gs, ks, vs, warp, g, t);
    if (whole_key_tile(mask, j0, limits)) {  // as in the forward: two loops
#pragma unroll
      for (int n = 0; n < S::kN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          // __fmul_rn: rounded before the subtraction, as visible_score's product is on the
          // other tiles (a fused multiply-add would differ in the last bit).
          const float prob = exp_ftz(__fmul_rn(s[n][e], p.scale) - row_lse[h]);
          s[n][e] = prob * (keep_scale(p.dropout, keeps, n, e) * dp[n][e] - row_d[h]) * p.scale;
        }
    } else {
#pragma unroll
      for (int n = 0; n < S::kN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2, c = n * 8 + 2 * t + (e & 1);
          const int64_t j = j0 + c;
          float ds = 0.0f;
          if (j < limits[h] && (!mask || mask[j])) {
            const float prob = exp_ftz(visible_score(mask, j, s[n][e], p.scale, fill) - row_lse[h]);
            ds = prob * (keep_scale(p.dropout, keeps, n, e) * dp[n][e] - row_d[h]) * p.scale;
          }
          s[n][e] = ds;
        }
    }
    accumulate_product<Ops, MaxD>(dqa, s, ks, g, t);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (rows[h] < p.tq) store_row(dq + query_at(p, bh) + rows[h] * p.ldq, dqa, h, p.d, t, 1.0f);
  }
#endif
}

// ---- backward: dK, dV ----
// Block: (batch·head, 64 key rows); warp: 16 keys, k fragments in registers (v's read from
// shared memory at each k step); walks the
// query tiles that see them: sᵀ = k·qᵀ, dPᵀ = v·dOᵀ, then dV += pᵀ·dO and dK += dSᵀ·q.
// Shared memory: the block's own k and v tiles and the query-side tiles (QueryTiles).
template <class Ops, int MaxD, class In, bool kPipelined = false>
__global__ void __launch_bounds__(kBlockThreads)
    mma_backward_kv_kernel(const In* q, const In* k, const In* v, const In* g_out, const float* lse,
                           const float* dvec, In* dk, In* dv, Params p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  if (batch_skipped(p, int64_t(blockIdx.x) / (p.heads / p.group))) return;  // a key/value slice's batch
  fold_last_in(p.dropout);
  using S = Shape<Ops, MaxD>;
  using Elem = typename Ops::Elem;
  using Tiles = QueryTiles<Elem, MaxD, S::kLd, kPipelined, In>;
  extern __shared__ __align__(128) unsigned char smem[];
  Elem* kself = reinterpret_cast<Elem*>(smem);
  Elem* vself = reinterpret_cast<Elem*>(smem + S::kTile);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Block: a key/value slice; its gradients sum over the query heads of its group.
  const int64_t kv = blockIdx.x, k0 = int64_t(blockIdx.y) * kRows, wk0 = k0 + warp * 16, offset = p.tk - p.tq;
  // Query i sees key j when i >= j - offset: the tiles from the one holding the first such query.
  const int64_t first_tile = (p.causal ? max(int64_t(0), k0 - offset) : 0) / kCols * kCols;
  const Tiles tiles{smem + 2 * S::kTile, q, g_out, lse, dvec, p, kv, first_tile,
                    first_tile < p.tq ? (p.tq - first_tile + kCols - 1) / kCols : 0};
  tiles.start();  // the first query tiles' copy runs under the own tiles' load

  load_pair<Elem, MaxD, S::kLd>(kself, k + key_at(p, kv), vself, v + key_at(p, kv), p.tk, k0, p.ldk, p.ldk, p);
  __syncthreads();
  Val<Ops> ka[S::kSteps][4];
#pragma unroll
  for (int st = 0; st < S::kSteps; ++st) load_a<Ops>(ka[st], kself, S::kLd, warp * 16, st * Ops::kK, g, t);
  const int64_t keys[2] = {wk0 + g, wk0 + g + 8};
  const bool* mask = mask_row(p, kv * p.group);  // the group's query heads share a batch row
  const float fill = masked_fill(p, mask);
  bool unmasked[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) unmasked[h] = !mask || (keys[h] < p.tk && mask[keys[h]]);
  float dka[S::kDN][4] = {}, dva[S::kDN][4] = {};
  // The query heads of the group, each one's tiles in order (the sums' order of before).
  for (int64_t it = 0; it < tiles.count(); ++it) {
    tiles.ready(it);
    const int64_t bh = tiles.head(it), i0 = tiles.first_query(it);
    if (wk0 >= p.tk || (p.causal && i0 + kCols - 1 < wk0 - offset)) continue;
    const Elem* qs = tiles.q_tile(it);
    const Elem* gs = tiles.g_tile(it);
    const float* lse_s = tiles.lse_of(it);
    const float* dvec_s = tiles.dvec_of(it);
    float st_[S::kN][4] = {}, dpt[S::kN][4] = {};
    const keep_lanes::ColumnKeeps keeps =
        p.dropout.on && p.keep_bits ? load_keeps_by_columns(p, bh, i0, wk0, lane)
                                    : draw_keeps_by_columns(p.dropout, (bh * p.tq + i0) * p.tk + wk0, p.tk, lane);
    score_pair<Ops, MaxD>(st_, dpt, ka, vself, qs, gs, warp, g, t);
    // Every query of the tile sees both of this thread's keys, and no padding mask: no
    // per-element visibility test (only tiles across the causal diagonal or an edge test).
    const bool whole =
        !mask && keys[1] < p.tk && i0 + kCols <= p.tq && (!p.causal || keys[1] <= i0 + offset);
#pragma unroll
    for (int n = 0; n < S::kN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * t + (e & 1);
        const int64_t i = i0 + c, j = keys[e / 2];
        float prob = 0.0f, ds = 0.0f;
        if (whole || j < visible_keys(p, i)) {
          const float keep = keep_scale(p.dropout, keeps, n, e);
          const float pr = exp_ftz(visible_score(mask, j, st_[n][e], p.scale, fill) - lse_s[c]);
          // where() passes no gradient to a padded-out key's score.
          if (unmasked[e / 2]) ds = pr * (keep * dpt[n][e] - dvec_s[c]) * p.scale;
          prob = pr * keep;
        }
        st_[n][e] = prob;
        dpt[n][e] = ds;
      }
    accumulate_product<Ops, MaxD>(dva, st_, gs, g, t);
    accumulate_product<Ops, MaxD>(dka, dpt, qs, g, t);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (keys[h] >= p.tk) continue;
    store_row(dk + key_at(p, kv) + keys[h] * p.ldk, dka, h, p.d, t, 1.0f);
    store_row(dv + key_at(p, kv) + keys[h] * p.ldk, dva, h, p.d, t, 1.0f);
  }
#endif
}

// D_i = dO_i · O_i in f32, one warp per row of the (BH · Tq) query rows.
template <class In>
__global__ void row_dot_kernel(const In* g, const In* out, float* dvec, int64_t rows, Params p) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows || batch_skipped(p, row / p.tq / p.heads)) return;  // whole warps
  const int64_t at = output_at(p, row / p.tq) + (row % p.tq) * p.ldo;
  float acc = 0.0f;
  for (int c = lane; c < p.d; c += 32) acc += to_f32(g[at + c]) * to_f32(out[at + c]);
  acc = warp_sum(acc);
  if (lane == 0) dvec[row] = acc;
}

// The GPU has mma.sync TF32/bf16 (sm_80+) and the build holds these kernels for it: a build
// for an older architecture only (e.g. -DCMAKE_CUDA_ARCHITECTURES=75) would run them from
// PTX whose bodies are empty, so the scalar kernels take over instead.
bool has_tensor_core_kernels() {
  static const bool yes = [] {
    int major = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, active_device()), "compute capability");
    cudaFuncAttributes image{};
    check(cudaFuncGetAttributes(&image, mma_forward_kernel<F32Ops, 64, float>), "flash_attention kernel image");
    return major >= 8 && image.ptxVersion >= 80 && image.binaryVersion >= 80;
  }();
  return yes;
}


template <int D>
using HeadDim = std::integral_constant<int, D>;

// f(HeadDim<bound>) with the kernels' head-dim bound for d: 32, 64, 96 or 128 (a smaller d is
// zero-padded to it).
template <class F>
decltype(auto) with_head_dim(int64_t d, F&& f) {
  if (d <= 32) return f(HeadDim<32>{});
  if (d <= 64) return f(HeadDim<64>{});
  if (d <= 96) return f(HeadDim<96>{});
  return f(HeadDim<128>{});
}

// Calls f(ops, element, head dim) with the operand arithmetic, the arrays' device element type
// and the kernels' head-dim bound (32, 64, 96 or 128: a smaller d is zero-padded to it). bf16
// arrays multiply as bf16 whatever --precision says: their values are bf16 already, and TF32
// products of them would be exact, but the probabilities would not be rounded as the composed
// form's bf16 probabilities are.
template <class F>
void dispatch(DType dtype, const kernels::FlashAttentionShape& s, F&& f) {
  auto with_dim = [&](auto ops, auto elem) { with_head_dim(s.d, [&](auto md) { f(ops, elem, md); }); };
  if (dtype == DType::bf16) return with_dim(Bf16Ops{}, bf16_t{});
  switch (s.operands) {
    case kernels::FlashAttentionShape::Operands::bf16: with_dim(Bf16Ops{}, float{}); break;
    case kernels::FlashAttentionShape::Operands::tf32: with_dim(Tf32Ops{}, float{}); break;
    default: with_dim(F32Ops{}, float{}); break;
  }
}

// Shared memory per block of each kernel.
template <class Ops, int MaxD>
struct SharedBytes {
  using S = Shape<Ops, MaxD>;
  static constexpr size_t kForward = 3 * S::kTile;
  static constexpr size_t kBackwardQ = 4 * S::kTile;
  static constexpr size_t kBackwardKv = 4 * S::kTile + 2 * kCols * sizeof(float);
};

// A kernel's shared memory double-buffered: a second buffer of the tiles the block walks (two
// tiles, with the dK/dV kernel's 64 row statistics of each kind).
template <class Ops, int MaxD>
constexpr size_t with_second_buffer(size_t plain, bool row_statistics) {
  return plain + 2 * Shape<Ops, MaxD>::kTile + (row_statistics ? 2 * kCols * sizeof(float) : 0);
}

// The most shared memory a block may ask for on this GPU (227 KiB on sm_90, 163 on sm_80, 99
// on sm_86/89): f32 tiles at head dim 128 need 137 KiB in the dK/dV kernel.
size_t shared_memory_limit() {
  static const size_t bytes = [] {
    int v = 0;
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, active_device()),
          "shared memory per block");
    return size_t(v);
  }();
  return bytes;
}

// The largest block any operand arithmetic of `dtype`'s arrays needs at this head dim (f32
// arrays: f32 tiles under f32 or TF32 products; eligibility does not know the precision an op
// will run under, so f32 arrays are judged by their largest tiles even under --precision bf16).
size_t largest_shared_bytes(DType dtype, int64_t head_dim) {
  auto bound = [&](auto ops) {
    return with_head_dim(head_dim, [&](auto md) {
      return SharedBytes<decltype(ops), decltype(md)::value>::kBackwardKv;  // the largest of the three
    });
  };
  return dtype == DType::bf16 ? bound(Bf16Ops{}) : bound(F32Ops{});
}

// MT_ATTENTION_PIPELINE=0 keeps bf16 arrays on the single-buffered kernels (a comparison on
// the GPU, or a way around a fault); the double-buffered ones are the default. Read at each
// launch, so that a test can compare both in one process.
bool pipeline_enabled() {
  const char* v = std::getenv("MT_ATTENTION_PIPELINE");
  return !(v && std::string(v) == "0");
}

// Blocks of `kernel` with `bytes` of shared memory that one multiprocessor holds at once.
template <class Kernel>
int blocks_per_multiprocessor(Kernel kernel, size_t bytes) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
        "flash_attention shared memory");
  int blocks = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kBlockThreads, bytes), "flash_attention occupancy");
  return blocks;
}

// Whether the double-buffered kernel `piped` takes these arrays instead of `plain`: bf16 arrays
// (copied as they are into bf16 tiles; f32 tiles stay single-buffered), rows of whole 16-byte
// vectors whose 64-row offsets fit load_pair_async's 32 bits, the block's shared memory within
// the GPU's limit, and as many of its blocks on a multiprocessor as of plain's: the two extra
// tiles must not cost occupancy (at head dim 128 on an A100 they would halve it).
template <class In, class Kernel>
bool take_pipelined(const Params& params, Kernel plain, size_t plain_bytes, Kernel piped, size_t piped_bytes) {
  const int64_t widest = std::max({params.ldq, params.ldo, params.ldk});
  if (!std::is_same_v<In, bf16_t> || !params.vector_rows || !pipeline_enabled() ||
      piped_bytes > shared_memory_limit() || widest * kRows >= (int64_t(1) << 31))
    return false;
  static std::mutex mutex;
  static std::map<const void*, bool> keeps_occupancy;  // per kernel, on this process's GPU
  std::lock_guard<std::mutex> lock(mutex);
  auto it = keeps_occupancy.find(reinterpret_cast<const void*>(piped));
  if (it == keeps_occupancy.end())
    it = keeps_occupancy
             .emplace(reinterpret_cast<const void*>(piped),
                      blocks_per_multiprocessor(piped, piped_bytes) >= blocks_per_multiprocessor(plain, plain_bytes))
             .first;
  return it->second;
}

template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, size_t bytes, const char* what, Args... args) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), what);
  kernel<<<grid, kBlockThreads, bytes, stream()>>>(args...);
  check_launch(what);
}

// Launches of a double-buffered form, for tests that must know the form ran.
std::atomic<uint64_t> g_pipelined_launches{0};

// Launches `piped` (a kernel's double-buffered form) where take_pipelined takes it, else `plain`.
// Callers pass the plain kernel as `piped` too for arrays other than bf16, whose double-buffered
// forms are never instantiated.
template <class In, class Kernel, class... Args>
void launch_best(const Params& params, Kernel plain, size_t plain_bytes, Kernel piped, size_t piped_bytes, dim3 grid,
                 const char* what, Args... args) {
  if (take_pipelined<In>(params, plain, plain_bytes, piped, piped_bytes)) {
    launch(piped, grid, piped_bytes, what, args...);
    g_pipelined_launches.fetch_add(1, std::memory_order_relaxed);
  } else
    launch(plain, grid, plain_bytes, what, args...);
}

}  // namespace

uint64_t flash_attention_pipelined_launches() { return g_pipelined_launches.load(std::memory_order_relaxed); }

int64_t dropout_keep_bits_words(const Array& q, const kernels::FlashAttentionShape& s) {
  const char* v = std::getenv("MT_ATTENTION_DROPOUT_BITS");
  if (!(v && std::string(v) == "1") || s.dropout_rate <= 0 || !q.device().is_cuda() ||
      !flash_attention_tensor_cores(q, s.d))
    return 0;
  const int64_t words = s.batch_heads * s.tq * ((s.tk + kCols - 1) / kCols) * 2;
  // Kept from the forward to the backward, the bits grow as Tq · Tk: beyond the size of q and
  // the output together (long contexts) they would outweigh what flash attention saves, and
  // the backward draws its verdicts again.
  if (words * 4 > 2 * s.batch_heads * s.tq * s.d * int64_t(dtype_size(q.dtype()))) return 0;
  return words;
}

bool flash_attention_tensor_cores(const Array& q, int64_t head_dim) {
  return (q.dtype() == DType::f32 || q.dtype() == DType::bf16) && head_dim > 0 && head_dim <= kMaxTensorCoreHeadDim &&
         has_tensor_core_kernels() && largest_shared_bytes(q.dtype(), head_dim) <= shared_memory_limit();
}

void flash_attention_forward_tc(const Array& q, const Array& k, const Array& v, const kernels::FlashAttentionShape& s,
                                Array& out, Array& lse, const int32_t* only_batches) {
  MT_CHECK(s.d > 0 && s.d <= kMaxTensorCoreHeadDim, "[flash_attention] head dim ", s.d,
           " is past the tensor-core kernels' ", kMaxTensorCoreHeadDim);
  if (s.batch_heads * s.tq == 0) return;
  const dim3 grid(unsigned(s.batch_heads), unsigned((s.tq + kRows - 1) / kRows));
  dispatch(q.dtype(), s, [&](auto ops, auto elem, auto md) {
    using Ops = decltype(ops);
    using In = decltype(elem);
    constexpr int MaxD = decltype(md)::value;
    using Bytes = SharedBytes<Ops, MaxD>;
    constexpr bool kBf16 = std::is_same_v<In, bf16_t>;
    Params params = params_of(s, vector_rows(s, sizeof(In), {&q, &k, &v}));
    params.only_batches = only_batches;
    launch_best<In>(params, mma_forward_kernel<Ops, MaxD, In>, Bytes::kForward, mma_forward_kernel<Ops, MaxD, In, kBf16>,
                    with_second_buffer<Ops, MaxD>(Bytes::kForward, false), grid, "flash_attention (tensor cores, mma)",
                    ptr<In>(q), ptr<In>(k), ptr<In>(v), mptr<In>(out), mptr<float>(lse), params);
  });
}

void flash_attention_backward_tc(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                                 const Array& g, const kernels::FlashAttentionShape& s, Array& dq, Array& dk, Array& dv,
                                 const int32_t* only_batches) {
  MT_CHECK(s.d > 0 && s.d <= kMaxTensorCoreHeadDim, "[flash_attention_backward] head dim ", s.d,
           " is past the tensor-core kernels' ", kMaxTensorCoreHeadDim);
  const int64_t rows = s.batch_heads * s.tq;
  Array dvec = Array::empty({rows}, DType::f32, q.device());
  dispatch(q.dtype(), s, [&](auto ops, auto elem, auto md) {
    using Ops = decltype(ops);
    using In = decltype(elem);
    constexpr int MaxD = decltype(md)::value;
    Params params = params_of(s, vector_rows(s, sizeof(In), {&q, &k, &v, &g}));
    params.only_batches = only_batches;
    row_dot_kernel<In><<<unsigned((rows * 32 + 255) / 256), 256, 0, stream()>>>(ptr<In>(g), ptr<In>(out),
                                                                              mptr<float>(dvec), rows, params);
    check_launch("flash_attention_backward (row dots)");
    using Bytes = SharedBytes<Ops, MaxD>;
    constexpr bool kBf16 = std::is_same_v<In, bf16_t>;
    launch_best<In>(params, mma_backward_kv_kernel<Ops, MaxD, In>, Bytes::kBackwardKv,
                    mma_backward_kv_kernel<Ops, MaxD, In, kBf16>, with_second_buffer<Ops, MaxD>(Bytes::kBackwardKv, true),
                    dim3(unsigned(s.batch_heads / s.group), unsigned((s.tk + kRows - 1) / kRows)),
                    "flash_attention_backward (dK, dV; tensor cores, mma)", ptr<In>(q), ptr<In>(k), ptr<In>(v),
                    ptr<In>(g), ptr<float>(lse), ptr<float>(dvec), mptr<In>(dk), mptr<In>(dv), params);
    launch_best<In>(params, mma_backward_q_kernel<Ops, MaxD, In>, Bytes::kBackwardQ,
                    mma_backward_q_kernel<Ops, MaxD, In, kBf16>, with_second_buffer<Ops, MaxD>(Bytes::kBackwardQ, false),
                    dim3(unsigned(s.batch_heads), unsigned((s.tq + kRows - 1) / kRows)),
                    "flash_attention_backward (dQ; tensor cores, mma)", ptr<In>(q), ptr<In>(k), ptr<In>(v),
                    ptr<In>(g), ptr<float>(lse), ptr<float>(dvec), mptr<In>(dq), params);
  });
}

}  // namespace mt::cuda
