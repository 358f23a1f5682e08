// Dropout on the GPU from the same Philox 4x32-10 stream as core/rng: element i of the
// (global) array keeps its value when uniform_at(key, i) >= rate, so masks are bit-identical
// to the CPU's for the same key, whatever the device or the sharding.
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/cuda/stream_block.cuh"
#include "meshtrain/backend/random.h"

namespace mt::cuda {

namespace {

// The whole array (not a block of a sharded one): one Philox block gives the 4 uniforms of
// elements 4b .. 4b+3, so each thread computes it once for its 4 elements.
template <class T>
__global__ void dropout_whole_kernel(const T* x, T* out, int64_t n, uint64_t seed, uint64_t stream_id,
                                     const int64_t* fold_last, uint32_t steps, float scale) {
  stream_id = stream_of(stream_id, fold_last);
  MT_GRID_LOOP(b, (n + 3) / 4) {
    bool keep[4];
    keeps4(uint64_t(b), seed, stream_id, steps, keep);
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = b * 4 + lane;
      if (i >= n) break;
      out[i] = keep[lane] ? from_f32<T>(to_f32(x[i]) * scale) : from_f32<T>(0.0f);
    }
  }
}

// f32 with 16-byte aligned buffers: each thread's 4 elements move as one vector.
__global__ void dropout_whole_f32x4_kernel(const float4* x, float4* out, int64_t n4, uint64_t seed, uint64_t stream_id,
                                           const int64_t* fold_last, uint32_t steps, float scale) {
  stream_id = stream_of(stream_id, fold_last);
  MT_GRID_LOOP(b, n4) {
    bool keep[4];
    keeps4(uint64_t(b), seed, stream_id, steps, keep);
    const float4 v = x[b];
    const float in[4] = {v.x, v.y, v.z, v.w};
    float o[4];
    for (int lane = 0; lane < 4; ++lane) o[lane] = keep[lane] ? in[lane] * scale : 0.0f;
    out[b] = make_float4(o[0], o[1], o[2], o[3]);
  }
}

template <class T>
__global__ void dropout_kernel(const T* x, T* out, int64_t n, uint64_t seed, uint64_t stream_id,
                               const int64_t* fold_last, uint32_t steps, float scale, BlockMap map) {
  stream_id = stream_of(stream_id, fold_last);
  MT_GRID_LOOP(i, n) {
    out[i] = keeps_at_block(map, i, seed, stream_id, steps) ? from_f32<T>(to_f32(x[i]) * scale) : from_f32<T>(0.0f);
  }
}

// x + dropout(branch) in one pass, each element's uniform drawn at its global position.
template <class T>
__global__ void dropout_add_kernel(const T* x, const T* branch, T* out, int64_t n, uint64_t seed, uint64_t stream_id,
                                   const int64_t* fold_last, uint32_t steps, float scale, BlockMap map) {
  stream_id = stream_of(stream_id, fold_last);
  MT_GRID_LOOP(i, n) {
    const bool keep = keeps_at_block(map, i, seed, stream_id, steps);
    // Rounded as the composed x + dropout(branch): the dropped term first (__fmul_rn: never
    // fused into the sum), then the sum.
    const float kept = __fmul_rn(to_f32(branch[i]), scale);
    const float dropped = to_f32(keep ? from_f32<T>(kept) : from_f32<T>(0.0f));
    out[i] = from_f32<T>(to_f32(x[i]) + dropped);
  }
}

// x + dropout(branch) over the whole array: one Philox block per 4 elements, as
// dropout_whole_kernel (a block per element drew each block four times over).
template <class T>
__global__ void dropout_add_whole_kernel(const T* x, const T* branch, T* out, int64_t n, uint64_t seed,
                                         uint64_t stream_id, const int64_t* fold_last, uint32_t steps, float scale) {
  stream_id = stream_of(stream_id, fold_last);
  MT_GRID_LOOP(b, (n + 3) / 4) {
    bool keep[4];
    keeps4(uint64_t(b), seed, stream_id, steps, keep);
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = b * 4 + lane;
      if (i >= n) break;
      // Rounded as the composed x + dropout(branch): the dropped term first, then the sum.
      const float kept = __fmul_rn(to_f32(branch[i]), scale);
      const float dropped = to_f32(keep[lane] ? from_f32<T>(kept) : from_f32<T>(0.0f));
      out[i] = from_f32<T>(to_f32(x[i]) + dropped);
    }
  }
}

}  // namespace

void dropout(const Array& x, Array& out, const RngKey& key, double rate, const kernels::StreamBlock& block) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const BlockMap map = block_map(x.shape(), block, "dropout");
  const float scale = rate < 1.0 ? float(1.0 / (1.0 - rate)) : 0.0f;
  const uint32_t steps = kernels::keep_steps(rate);
  const int64_t* fold_last = rate > 0 ? fold_last_address(key) : nullptr;  // no draws at rate 0 (eval)
  dispatch_device_float(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const bool vector4 = std::is_same_v<T, float> && n % 4 == 0 && reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(out.raw()) % 16 == 0;
    if (map.ndim == 0 && vector4)
      dropout_whole_f32x4_kernel<<<blocks_for(n / 4), kThreads, 0, stream()>>>(
          static_cast<const float4*>(x.raw()), static_cast<float4*>(out.raw()), n / 4, key.seed, key.stream, fold_last,
          steps, scale);
    else if (map.ndim == 0)
      dropout_whole_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, stream()>>>(ptr<T>(x), mptr<T>(out), n, key.seed,
                                                                               key.stream, fold_last, steps, scale);
    else
      dropout_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<T>(x), mptr<T>(out), n, key.seed, key.stream,
                                                               fold_last, steps, scale, map);
  });
  check_launch("dropout");
}

void dropout_add(const Array& x, const Array& branch, Array& out, const RngKey& key, double rate,
                 const kernels::StreamBlock& block) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const BlockMap map = block_map(branch.shape(), block, "add_dropout");
  const float scale = rate < 1.0 ? float(1.0 / (1.0 - rate)) : 0.0f;
  const uint32_t steps = kernels::keep_steps(rate);
  const int64_t* fold_last = rate > 0 ? fold_last_address(key) : nullptr;  // no draws at rate 0 (eval)
  dispatch_device_float(x.dtype(), "add_dropout", [&](auto tag) {
    using T = decltype(tag);
    if (map.ndim == 0)
      dropout_add_whole_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, stream()>>>(
          ptr<T>(x), ptr<T>(branch), mptr<T>(out), n, key.seed, key.stream, fold_last, steps, scale);
    else
      dropout_add_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<T>(x), ptr<T>(branch), mptr<T>(out), n,
                                                                   key.seed, key.stream, fold_last, steps, scale, map);
  });
  check_launch("add_dropout");
}

}  // namespace mt::cuda
