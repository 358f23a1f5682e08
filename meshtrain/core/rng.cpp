#include "meshtrain/core/rng.h"

#include <cmath>

#include "meshtrain/core/array.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(kMul0) * c[0];
    uint64_t p1 = uint64_t(kMul1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1], uint32_t(p0)};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

std::array<uint32_t, 4> RngKey::block(uint64_t index) const {
  return philox4x32({uint32_t(index), uint32_t(index >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                    {uint32_t(seed), uint32_t(seed >> 32)});
}

RngKey RngKey::fold_in(uint64_t data) const {
  // Hash (stream, data) through Philox under a fixed key so derived streams never collide
  // with small literal stream numbers.
  auto h = philox4x32({uint32_t(data), uint32_t(data >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                      {uint32_t(kFoldInSeed), uint32_t(kFoldInSeed >> 32)});
  return RngKey{seed, uint64_t(h[0]) | uint64_t(h[1]) << 32, fold_last};
}

RngKey RngKey::folding_last(const Array& value) const {
  MT_CHECK(value.dtype() == DType::i64 && value.numel() == 1 && !value.sharded(),
           "[rng] a key's last fold must be one i64 value, got ", dtype_name(value.dtype()), value.shape().str());
  return RngKey{seed, stream, std::make_shared<const Array>(value)};
}

RngKey RngKey::resolved() const {
  if (!fold_last) return *this;
  MT_CHECK(fold_last->device().is_cpu(), "[rng] a key folding in a value on ", fold_last->device().str(),
           " is resolved by that device's kernels, not on the host");
  return RngKey{seed, stream}.fold_in(uint64_t(*fold_last->data<int64_t>()));
}

RngKey RngKey::host_resolved() const {
  if (!fold_last || fold_last->device().is_cpu()) return resolved();
  return RngKey{seed, stream}.fold_in(uint64_t(fold_last->to_ints().at(0)));
}

namespace {
inline float unit_open_closed(uint32_t u) { return (float(u >> 8) + 1.0f) * (1.0f / 16777216.0f); }  // (0, 1]
inline float unit_closed_open(uint32_t u) { return float(u >> 8) * (1.0f / 16777216.0f); }          // [0, 1)

// Box-Muller on lanes (0,1) for half 0 and (2,3) for half 1 of a block; double math keeps
// the result identical whichever code path (single element or bulk) computes it.
inline float box_muller(const std::array<uint32_t, 4>& w, uint64_t half) {
  double r = std::sqrt(-2.0 * std::log(double(unit_open_closed(w[2 * half]))));
  double theta = 2.0 * M_PI * double(unit_closed_open(w[2 * half + 1]));
  return float(r * std::cos(theta));
}
}  // namespace

float uniform_at(const RngKey& key, uint64_t i) { return unit_closed_open(key.block(i / 4)[i % 4]); }

float normal_at(const RngKey& key, uint64_t i) { return box_muller(key.block(i / 2), i % 2); }

// The bulk fills compute each Philox block once (4 uniforms or 2 normals per block)
// instead of once per element; values stay bitwise equal to uniform_at / normal_at.
namespace {

// Philox4x32-10 of the 16 counters first_block .. first_block + 15 at once, lanes split into
// four arrays so the rounds vectorize (32x32->64-bit multiplies across the 16 blocks).
void philox_16_blocks(const RngKey& key, uint64_t first_block, uint32_t (&w)[4][16]) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0[16], c1[16], c2[16], c3[16];
  for (int j = 0; j < 16; ++j) {
    const uint64_t b = first_block + uint64_t(j);
    c0[j] = uint32_t(b);
    c1[j] = uint32_t(b >> 32);
    c2[j] = uint32_t(key.stream);
    c3[j] = uint32_t(key.stream >> 32);
  }
  uint32_t k0 = uint32_t(key.seed), k1 = uint32_t(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
#pragma omp simd
    for (int j = 0; j < 16; ++j) {
      const uint64_t p0 = uint64_t(kMul0) * c0[j], p1 = uint64_t(kMul1) * c2[j];
      const uint32_t n0 = uint32_t(p1 >> 32) ^ c1[j] ^ k0, n2 = uint32_t(p0 >> 32) ^ c3[j] ^ k1;
      c0[j] = n0;
      c1[j] = uint32_t(p1);
      c2[j] = n2;
      c3[j] = uint32_t(p0);
    }
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  for (int j = 0; j < 16; ++j) {
    w[0][j] = c0[j];
    w[1][j] = c1[j];
    w[2][j] = c2[j];
    w[3][j] = c3[j];
  }
}

}  // namespace

void fill_uniform(const RngKey& key, uint64_t offset, int64_t n, float* out) {
  MT_CHECK(!key.fold_last, "[rng] fill_uniform needs a resolved key (RngKey::resolved)");
  if (n <= 0) return;
  const uint64_t end = offset + uint64_t(n);
  // Element i is lane i % 4 of block i / 4. Whole groups of 16 blocks go through the
  // vectorized Philox; the ragged ends (and short fills) one block at a time.
  const uint64_t first_group = (offset + 63) / 64, end_group = end / 64;
  auto one_by_one = [&](uint64_t from, uint64_t to) {
    for (uint64_t i = from; i < to;) {
      const auto w = key.block(i / 4);
      for (uint64_t lane = i % 4; lane < 4 && i < to; ++lane, ++i) out[i - offset] = unit_closed_open(w[lane]);
    }
  };
  if (first_group >= end_group) {
    one_by_one(offset, end);
    return;
  }
  one_by_one(offset, first_group * 64);
  const int64_t groups = int64_t(end_group - first_group);
  auto group = [&](int64_t g) {
    uint32_t w[4][16];
    const uint64_t block0 = (first_group + uint64_t(g)) * 16;
    philox_16_blocks(key, block0, w);
    float* o = out + (block0 * 4 - offset);
    for (int j = 0; j < 16; ++j)
      for (int lane = 0; lane < 4; ++lane) o[j * 4 + lane] = unit_closed_open(w[lane][j]);
  };
  // Short fills (a row of dropout factors inside a kernel's own threads) stay out of OpenMP.
  grain::parallel_for(n, grain::copy, groups, group);
  one_by_one(end_group * 64, end);
}

void fill_normal(const RngKey& key, uint64_t offset, int64_t n, float* out) {
  MT_CHECK(!key.fold_last, "[rng] fill_normal needs a resolved key (RngKey::resolved)");
  if (n <= 0) return;
  const uint64_t first = offset / 2, end = offset + uint64_t(n);
  const int64_t blocks = int64_t((end - 1) / 2 - first + 1);
  auto one_block = [&](int64_t b) {
    const uint64_t block = first + uint64_t(b);
    const auto w = key.block(block);
    for (uint64_t half = 0; half < 2; ++half) {
      const uint64_t i = block * 2 + half;
      if (i < offset || i >= end) continue;
      out[i - offset] = box_muller(w, half);
    }
  };
  grain::parallel_for(n, grain::compute, blocks, one_block);  // random_normal's chunks: serial
}

}  // namespace mt
