#include "meshtrain/core/rng.h"

#include <cmath>

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
                      {0x6d657368u, 0x74726169u});
  return RngKey{seed, uint64_t(h[0]) | uint64_t(h[1]) << 32};
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
void fill_uniform(const RngKey& key, uint64_t offset, int64_t n, float* out) {
  if (n <= 0) return;
  const uint64_t first = offset / 4, end = offset + uint64_t(n);
  const int64_t blocks = int64_t((end - 1) / 4 - first + 1);
#pragma omp parallel for if (n > 65536) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const uint64_t block = first + uint64_t(b);
    const auto w = key.block(block);
    for (uint64_t lane = 0; lane < 4; ++lane) {
      const uint64_t i = block * 4 + lane;
      if (i >= offset && i < end) out[i - offset] = unit_closed_open(w[lane]);
    }
  }
}

void fill_normal(const RngKey& key, uint64_t offset, int64_t n, float* out) {
  if (n <= 0) return;
  const uint64_t first = offset / 2, end = offset + uint64_t(n);
  const int64_t blocks = int64_t((end - 1) / 2 - first + 1);
#pragma omp parallel for if (n > 32768) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const uint64_t block = first + uint64_t(b);
    const auto w = key.block(block);
    for (uint64_t half = 0; half < 2; ++half) {
      const uint64_t i = block * 2 + half;
      if (i < offset || i >= end) continue;
      out[i - offset] = box_muller(w, half);
    }
  }
}

}  // namespace mt
