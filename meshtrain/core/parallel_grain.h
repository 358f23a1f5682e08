#pragma once
// How much work (elements touched) a loop needs before it runs on the OpenMP team: waking
// the team costs microseconds, more than a small loop takes. One table, so the thresholds
// are tuned together (and measured in bench/) instead of as literals in each kernel.
#include <cstdint>

namespace mt::grain {

// Per-element arithmetic and math functions (elementwise ops, reductions, losses, normal
// random numbers).
inline constexpr int64_t compute = 32768;
// Memory-bound moves (casts, gathers, scatters, strided copies, uniform random bits); also
// the chunk of a long staging conversion.
inline constexpr int64_t copy = 65536;
// Row-wise kernels making several passes over each row (norms, softmax); also the chunk a
// single long elementwise row is split into.
inline constexpr int64_t row = 16384;

}  // namespace mt::grain
