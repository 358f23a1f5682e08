#pragma once
// Where a block of a sharded array sits in its global array, on the device: the random kernels
// draw element i's uniform at its global flat index, so a rank's block masks exactly as the
// whole array would (and as the CPU kernels do for the same key).
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/random.h"

namespace mt::cuda {

// Local dims, global strides, block offsets; ndim 0: the array is the whole global array.
struct BlockMap {
  int ndim = 0;
  int64_t local[kMaxDims] = {};
  int64_t global_stride[kMaxDims] = {};
  int64_t offset[kMaxDims] = {};
};

inline BlockMap block_map(const Shape& local, const kernels::StreamBlock& block, const char* op) {
  BlockMap map;
  if (block.global_dims.empty() || local.ndim() == 0) return map;
  MT_CHECK(local.ndim() <= kMaxDims, "[", op, "] more than ", kMaxDims, " dims on the GPU");
  const std::vector<int64_t> gs = Shape(block.global_dims).strides();
  map.ndim = local.ndim();
  for (int d = 0; d < local.ndim(); ++d) {
    map.local[d] = local[d];
    map.global_stride[d] = gs[size_t(d)];
    map.offset[d] = block.offsets[size_t(d)];
  }
  return map;
}

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

// The dropout verdicts (core/rng's uniform_at(key, i) >= rate; steps = kernels::keep_steps(rate))
// of elements 4b .. 4b + 3 of a whole array, from the one Philox block that holds their
// uniforms; at rate 0 (eval) nothing is drawn and every element is kept.
__device__ inline void keeps4(uint64_t b, uint64_t seed, uint64_t stream_id, uint32_t steps, bool (&keep)[4]) {
  uint32_t w[4] = {~0u, ~0u, ~0u, ~0u};
  if (steps > 0) philox_block(b, seed, stream_id, w);
#pragma unroll
  for (int q = 0; q < 4; ++q) keep[q] = keeps_word(w[q], steps);
}

// The dropout verdict of local element i of a block, drawn at its global index.
__device__ inline bool keeps_at_block(const BlockMap& map, int64_t i, uint64_t seed, uint64_t stream_id,
                                      uint32_t steps) {
  return keeps_word(philox_element(global_index(map, i), seed, stream_id), steps);
}

}  // namespace mt::cuda
