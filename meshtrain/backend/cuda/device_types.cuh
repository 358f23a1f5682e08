#pragma once
// Device-side element types for the .cu kernels: bf16/f16 as raw 16-bit patterns, converted
// exactly as core/dtype.h converts them on the host, so both backends round identically.
#include <cuda_fp16.h>

#include <type_traits>

#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/core/rng.h"

namespace mt::cuda {

// ---- device element types ----
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

__host__ __device__ inline float to_f32(float v) { return v; }
__host__ __device__ inline float to_f32(bf16_t v) {
  const uint32_t u = uint32_t(v.bits) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
__device__ inline float to_f32(f16_t v) { return __half2float(__ushort_as_half(v.bits)); }

template <class T>
__device__ inline T from_f32(float f);
template <>
__device__ inline float from_f32<float>(float f) { return f; }
template <>
__device__ inline bf16_t from_f32<bf16_t>(float f) {
  // Round to nearest even; NaN stays a quiet NaN (as core/dtype.h's f32_to_bf16).
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{uint16_t(u >> 16)};
}
template <>
__device__ inline f16_t from_f32<f16_t>(float f) { return f16_t{__half_as_ushort(__float2half_rn(f))}; }

template <class T>
constexpr bool is_float_v = std::is_same_v<T, float> || std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>;

// Calls f(T{}) with the device element type of `dtype`.
template <class F>
void dispatch_device(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(bf16_t{}); return;
    case DType::f16: f(f16_t{}); return;
    case DType::i32: f(int32_t{}); return;
    case DType::i64: f(int64_t{}); return;
    case DType::boolean: f(bool{}); return;
  }
  throw Error(detail::concat("[", op, "] unsupported dtype on the GPU"));
}
template <class F>
void dispatch_device_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(bf16_t{}); return;
    case DType::f16: f(f16_t{}); return;
    default: break;
  }
  throw Error(detail::concat("[", op, "] expected a floating dtype (f32, bf16, f16), got ", dtype_name(dtype)));
}

// The type elementwise math runs in (as the CPU kernels): f32 for floating dtypes, the
// integer itself for integers, int32 for bool.
template <class T>
struct compute {
  using type = T;
};
template <>
struct compute<bf16_t> {
  using type = float;
};
template <>
struct compute<f16_t> {
  using type = float;
};
template <>
struct compute<bool> {
  using type = int32_t;
};
template <class T>
using compute_t = typename compute<T>::type;

template <class T>
__device__ inline compute_t<T> load(T v) {
  if constexpr (is_float_v<T>) return to_f32(v);
  else return compute_t<T>(v);
}
template <class T, class C>
__device__ inline T store(C v) {
  if constexpr (is_float_v<T>) return from_f32<T>(float(v));
  else if constexpr (std::is_same_v<T, bool>) return v != C(0);
  else return T(v);
}
template <class T>
__device__ inline double load_double(T v) {
  if constexpr (is_float_v<T>) return double(to_f32(v));
  else return double(v);
}

// Warp-wide sum of a per-lane value (all 32 lanes present); every lane gets the result.
template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide sum of a per-thread value (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. `shared` holds 32 values.
template <class T>
__device__ inline T block_sum(T v, T* shared) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  return warp_sum(lane < warps ? shared[lane] : T(0));
}
template <class T>
__device__ inline T block_max(T v, T* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  T t = lane < warps ? shared[lane] : T(-INFINITY);
  for (int o = 16; o > 0; o >>= 1) t = fmax(t, __shfl_xor_sync(0xffffffffu, t, o));
  return t;
}

// Philox 4x32-10 block `block` of the stream (seed, stream_id): the four words behind
// elements 4·block .. 4·block+3 of core/rng's uniform sequence (uniform = (w >> 8) / 2^24).
__device__ inline void philox_block(uint64_t block, uint64_t seed, uint64_t stream_id, uint32_t (&w)[4]) {
  uint32_t c0 = uint32_t(block), c1 = uint32_t(block >> 32), c2 = uint32_t(stream_id), c3 = uint32_t(stream_id >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    // The halves of the 32 x 32 -> 64-bit products as __umulhi and a low product: ptxas fuses
    // each pair into one wide multiply, where the halves of a uint64_t product cost each round
    // two more additions (of a zero register) in the attention kernels' draws.
    const uint32_t h0 = __umulhi(0xD2511F53u, c0), l0 = 0xD2511F53u * c0;
    const uint32_t h1 = __umulhi(0xCD9E8D57u, c2), l1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = h1 ^ c1 ^ k0, n2 = h0 ^ c3 ^ k1;
    c0 = n0;
    c1 = l1;
    c2 = n2;
    c3 = l0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  w[0] = c0, w[1] = c1, w[2] = c2, w[3] = c3;
}

// The Philox word behind element i of the stream: word i % 4 of block i / 4. The run-time
// index puts the 4 words in local memory (16 bytes of stack), which only the element-by-element
// paths (sharded blocks, rows off a block boundary) take; selecting them instead cost the
// attention dQ kernel 7 registers, past the 168 that keep 3 blocks on a multiprocessor.
__device__ inline uint32_t philox_element(uint64_t i, uint64_t seed, uint64_t stream_id) {
  uint32_t w[4];
  philox_block(i / 4, seed, stream_id, w);
  return w[i % 4];
}

// RngKey::fold_in's stream on the device: (stream, data) hashed under core/rng's fold seed.
__device__ inline uint64_t fold_stream(uint64_t stream_id, uint64_t data) {
  uint32_t w[4];
  philox_block(data, kFoldInSeed, stream_id, w);
  return uint64_t(w[0]) | uint64_t(w[1]) << 32;
}

// A key's stream with its last fold (RngKey::fold_last, read from device memory when the
// kernel runs; null: none) folded in. Kernels call it once per thread, before drawing.
__device__ inline uint64_t stream_of(uint64_t stream_id, const int64_t* fold_last) {
  return fold_last ? fold_stream(stream_id, uint64_t(*fold_last)) : stream_id;
}

// The device address of a key's last fold for the kernels' stream_of (null when it has none).
inline const int64_t* fold_last_address(const RngKey& key) {
  if (!key.fold_last) return nullptr;
  MT_CHECK(key.fold_last->device().is_cuda(), "[cuda] a GPU kernel's random key folds in a value on ",
           key.fold_last->device().str(), "; it must be on the GPU");
  return key.fold_last->data<int64_t>();
}

// Dropout's verdict on a Philox word, steps = kernels::keep_steps(rate) (backend/random.h):
// the CPU's double compare uniform >= rate, bit for bit, as one integer compare. The float
// form spent a conversion, a widening to double (a quarter-rate instruction) and a double
// compare per element, in the attention kernels' inner loops among others.
__device__ inline bool keeps_word(uint32_t word, uint32_t steps) { return (word >> 8) >= steps; }

// i mod c for a kernel's non-negative flat indices: a 64-bit remainder is a software routine
// of some hundred instructions on the GPU, a 32-bit one a few dozen, and nearly every array's
// indices fit in 32 bits (the per-column bias of a (rows, c) array is read this way).
__device__ inline int64_t index_mod(int64_t i, int64_t c) {
  return ((uint64_t(i) | uint64_t(c)) >> 32) == 0 ? int64_t(uint32_t(i) % uint32_t(c)) : i % c;
}
// i / c likewise.
__device__ inline int64_t index_div(int64_t i, int64_t c) {
  return ((uint64_t(i) | uint64_t(c)) >> 32) == 0 ? int64_t(uint32_t(i) / uint32_t(c)) : i / c;
}

// Elements of T in one 16-byte load or store (the kernels' vector paths).
template <class T>
constexpr int kVecElems = int(16 / sizeof(T));

// Grid-stride loop over [0, n).
#define MT_GRID_LOOP(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

}  // namespace mt::cuda
