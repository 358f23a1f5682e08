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

// fn(i) for i in [0, count): on the OpenMP team when `work` (elements touched) exceeds
// `threshold`, else a plain loop. Not `omp parallel for if (...)`: GCC enters the runtime even
// when the condition is false, and called inside another parallel region (a helper a kernel
// runs per row in its own threads) that costs a one-thread team and futex calls every time.
template <class Fn>
void parallel_for(int64_t work, int64_t threshold, int64_t count, Fn&& fn) {
  if (work > threshold) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) fn(i);
  } else {
    for (int64_t i = 0; i < count; ++i) fn(i);
  }
}

}  // namespace mt::grain
