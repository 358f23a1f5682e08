#pragma once
#include <array>
#include <cstdint>
#include <memory>

namespace mt {

class Array;

// Philox 4x32-10 counter-based generator: every output block is a pure function of
// (key, counter), so any element of a random array can be generated alone.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// A JAX-style random key: `seed` selects the generator, `stream` separates independent
// uses (each parameter, each dropout site) of the same seed.
struct RngKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
  // A value folded in after every fold_in, read from memory when a kernel runs: an i64 scalar
  // array on the kernel's device. The Trainer keeps its step number there, so each step
  // launches its dropout kernels with the same arguments (a captured CUDA graph replays them
  // as recorded) and still draws new masks. Null: nothing more to fold.
  std::shared_ptr<const Array> fold_last{};

  // A new independent key derived from this one and `data` (a step number, a layer index);
  // it keeps fold_last, which stays the last fold.
  RngKey fold_in(uint64_t data) const;
  // This key with `value` (an i64 scalar array) as its fold_last.
  RngKey folding_last(const Array& value) const;
  // The key kernels draw from: fold_last's current value folded in (read in place: it must be
  // a CPU array here; the GPU kernels fold it themselves). A key without fold_last is itself.
  RngKey resolved() const;
  // resolved() for code on the host whatever the value's device (a Python loss function, which
  // takes its key as numbers): a value on a GPU is read to the host, a wait for the device.
  RngKey host_resolved() const;
  // The block of four words for element block `index` of this key (which must be resolved).
  std::array<uint32_t, 4> block(uint64_t index) const;
};

// The seed under which RngKey::fold_in hashes (stream, data): the GPU kernels fold alike.
constexpr uint64_t kFoldInSeed = 0x747261696d657368ull;

// Element i of the uniform [0, 1) / standard normal sequence of `key`. Element i of a
// whole random array equals element i generated alone: the basis of sharded init.
float uniform_at(const RngKey& key, uint64_t i);
float normal_at(const RngKey& key, uint64_t i);
void fill_uniform(const RngKey& key, uint64_t offset, int64_t n, float* out);  // out: (n,)
void fill_normal(const RngKey& key, uint64_t offset, int64_t n, float* out);   // out: (n,)

}  // namespace mt
