// Dropout on the GPU from the same Philox 4x32-10 stream as core/rng: element i of the
// (global) array keeps its value when uniform_at(key, i) >= rate, so masks are bit-identical
// to the CPU's for the same key, whatever the device or the sharding.
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/random.h"

namespace mt::cuda {

namespace {

// Where local elements sit in the global array: local dims, global strides, block offsets.
struct BlockMap {
  int ndim = 0;  // 0: the array is the whole global array
  int64_t local[kMaxDims] = {};
  int64_t global_stride[kMaxDims] = {};
  int64_t offset[kMaxDims] = {};
};

__device__ inline uint64_t global_index(const BlockMap& b, int64_t i) {
  if (b.ndim == 0) return uint64_t(i);
  int64_t g = 0;
  for (int d = b.ndim - 1; d >= 0; --d) {
    const int64_t c = i % b.local[d];
    i /= b.local[d];
    g += (c + b.offset[d]) * b.global_stride[d];
  }
  return uint64_t(g);
}

__device__ inline uint32_t philox_word(uint64_t block, uint32_t lane, uint64_t seed, uint64_t stream_id) {
  uint32_t w[4];
  philox_block(block, seed, stream_id, w);
  return w[lane];
}

// The whole array (not a block of a sharded one): one Philox block gives the 4 uniforms of
// elements 4b .. 4b+3, so each thread computes it once for its 4 elements.
template <class T>
__global__ void dropout_whole_kernel(const T* x, T* out, int64_t n, uint64_t seed, uint64_t stream_id, double rate,
                                     float scale) {
  MT_GRID_LOOP(b, (n + 3) / 4) {
    uint32_t w[4];
    philox_block(uint64_t(b), seed, stream_id, w);
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = b * 4 + lane;
      if (i >= n) break;
      out[i] = double(philox_uniform(w[lane])) >= rate ? from_f32<T>(to_f32(x[i]) * scale) : from_f32<T>(0.0f);
    }
  }
}

// f32 with 16-byte aligned buffers: each thread's 4 elements move as one vector.
__global__ void dropout_whole_f32x4_kernel(const float4* x, float4* out, int64_t n4, uint64_t seed, uint64_t stream_id,
                                           double rate, float scale) {
  MT_GRID_LOOP(b, n4) {
    uint32_t w[4];
    philox_block(uint64_t(b), seed, stream_id, w);
    const float4 v = x[b];
    const float in[4] = {v.x, v.y, v.z, v.w};
    float o[4];
    for (int lane = 0; lane < 4; ++lane)
      o[lane] = double(philox_uniform(w[lane])) >= rate ? in[lane] * scale : 0.0f;
    out[b] = make_float4(o[0], o[1], o[2], o[3]);
  }
}

template <class T>
__global__ void dropout_kernel(const T* x, T* out, int64_t n, uint64_t seed, uint64_t stream_id, double rate,
                               float scale, BlockMap map) {
  MT_GRID_LOOP(i, n) {
    const uint64_t g = global_index(map, i);
    const float uniform = philox_uniform(philox_word(g / 4, uint32_t(g % 4), seed, stream_id));
    out[i] = double(uniform) >= rate ? from_f32<T>(to_f32(x[i]) * scale) : from_f32<T>(0.0f);
  }
}

}  // namespace

void dropout(const Array& x, Array& out, const RngKey& key, double rate, const kernels::StreamBlock& block) {
  const int64_t n = x.numel();
  if (n == 0) return;
  BlockMap map;
  if (!block.global_dims.empty() && x.ndim() > 0) {
    MT_CHECK(x.ndim() <= kMaxDims, "[dropout] more than ", kMaxDims, " dims on the GPU");
    const std::vector<int64_t> gs = Shape(block.global_dims).strides();
    map.ndim = x.ndim();
    for (int d = 0; d < x.ndim(); ++d) {
      map.local[d] = x.dim(d);
      map.global_stride[d] = gs[size_t(d)];
      map.offset[d] = block.offsets[size_t(d)];
    }
  }
  const float scale = rate < 1.0 ? float(1.0 / (1.0 - rate)) : 0.0f;
  dispatch_device_float(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const bool vector4 = std::is_same_v<T, float> && n % 4 == 0 && reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(out.raw()) % 16 == 0;
    if (map.ndim == 0 && vector4)
      dropout_whole_f32x4_kernel<<<blocks_for(n / 4), kThreads, 0, stream()>>>(
          static_cast<const float4*>(x.raw()), static_cast<float4*>(out.raw()), n / 4, key.seed, key.stream, rate, scale);
    else if (map.ndim == 0)
      dropout_whole_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, stream()>>>(ptr<T>(x), mptr<T>(out), n, key.seed,
                                                                               key.stream, rate, scale);
    else
      dropout_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<T>(x), mptr<T>(out), n, key.seed, key.stream, rate,
                                                               scale, map);
  });
  check_launch("dropout");
}

}  // namespace mt::cuda
