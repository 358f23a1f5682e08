#pragma once
#include <array>
#include <cstdint>

namespace mt {

// Philox 4x32-10 counter-based generator: every output block is a pure function of
// (key, counter), so any element of a random array can be generated alone.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// A JAX-style random key: `seed` selects the generator, `stream` separates independent
// uses (each parameter, each dropout site) of the same seed.
struct RngKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
  // A new independent key derived from this one and `data` (a step number, a layer index).
  RngKey fold_in(uint64_t data) const;
  // The block of four words for element block `index` of this key.
  std::array<uint32_t, 4> block(uint64_t index) const;
};

// Element i of the uniform [0, 1) / standard normal sequence of `key`. Element i of a
// whole random array equals element i generated alone: the basis of sharded init.
float uniform_at(const RngKey& key, uint64_t i);
float normal_at(const RngKey& key, uint64_t i);
void fill_uniform(const RngKey& key, uint64_t offset, int64_t n, float* out);  // out: (n,)
void fill_normal(const RngKey& key, uint64_t offset, int64_t n, float* out);   // out: (n,)

}  // namespace mt
