#pragma once
// Random array kernels over the counter-based Philox stream of a key: cpu/random.cpp and
// cuda/random.cu. Element i of an output is always stream element i (its row-major flat
// index), whatever the chunking, so both backends draw the same values.
#include <cmath>
#include <cstdint>
#include <vector>

#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"

namespace mt::kernels {

// Where an array's elements sit in the global array whose stream they draw from: a rank's
// block of a sharded array takes the values of its global positions, so sharded random
// arrays equal the single-device ones. Empty = the array is the whole global array.
struct StreamBlock {
  std::vector<int64_t> global_dims;
  std::vector<int64_t> offsets;  // the block's start in each dim
};

// The global flat index of element (row, 0) of an array viewed as rows of its last dim, for a
// block described by `block` (the row itself when the array is the whole global array): rows
// run over consecutive stream elements, so a kernel draws a row's uniforms in one call.
inline int64_t row_stream_start(const Shape& local, const StreamBlock& block, int64_t row) {
  if (block.global_dims.empty() || local.ndim() == 0) return row * (local.ndim() == 0 ? 1 : local.dim(-1));
  const std::vector<int64_t> gstrides = Shape(block.global_dims).strides();
  int64_t g = block.offsets.back() * gstrides.back(), rem = row;
  for (int d = local.ndim() - 2; d >= 0; --d) {
    g += (rem % local[d] + block.offsets[size_t(d)]) * gstrides[size_t(d)];
    rem /= local[d];
  }
  return g;
}

// Dropout keeps element i when uniform_at(key, i) >= rate, compared in double. A uniform is
// k / 2^24 for the top 24 bits k of its Philox word, and rate · 2^24 is exact (only the
// exponent moves), so the test is k >= ceil(rate · 2^24): keep_steps(rate), at most 2^24 (no
// element kept; NaN too, as no uniform compares >= NaN). The GPU kernels compare the integers,
// which spares a conversion, a widening to double and a double compare per element.
inline uint32_t keep_steps(double rate) {
  if (rate <= 0) return 0;
  if (!(rate < 1)) return 1u << 24;
  return uint32_t(std::ceil(rate * 16777216.0));
}
// The f32 t with (u >= t) == (double(u) >= rate) for every uniform u: the keep test in f32,
// so the CPU loops applying it vectorize on 8 floats.
inline float keep_threshold(double rate) { return float(keep_steps(rate)) * (1.0f / 16777216.0f); }

}  // namespace mt::kernels

// dropout: out[i] = uniform_at(key, i) >= rate ? x[i] / (1 - rate) : 0; x any shape, floating;
//   out has x's shape and dtype.
// dropout_add: out[i] = x[i] + dropout(branch)[i], the residual add of a dropped branch in one
//   pass (the mask drawn at the branch's positions); x, branch and out share shape and dtype.
#define MT_RANDOM_KERNELS                                                                                  \
  void dropout(const Array& x, Array& out, const RngKey& key, double rate, const kernels::StreamBlock& block = {}); \
  void dropout_add(const Array& x, const Array& branch, Array& out, const RngKey& key, double rate,                \
                   const kernels::StreamBlock& block = {});

namespace mt::cpu {
MT_RANDOM_KERNELS
// Initialization draws on the host (and copies to a GPU), so these have no GPU twin.
// out[i] = lo + (hi - lo) * uniform_at(key, i).   out: any shape, floating dtype.
void random_uniform(const RngKey& key, Array& out, double lo, double hi, const kernels::StreamBlock& block = {});
// out[i] = mean + std * normal_at(key, i).        out: any shape, floating dtype.
void random_normal(const RngKey& key, Array& out, double mean, double std, const kernels::StreamBlock& block = {});
// out[i] = uniform_at(key, i) < p.                out: any shape, bool.
void bernoulli(const RngKey& key, Array& out, double p, const kernels::StreamBlock& block = {});
}  // namespace mt::cpu
namespace mt::cuda { MT_RANDOM_KERNELS }
