#include "meshtrain/backend/cpu/bf16_dot_rate.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace mt::cpu {
namespace {

// Twelve independent accumulators hide either instruction's latency (4–6 cycles, two ports at
// most), so each loop runs at the instruction's throughput.
constexpr int kAccumulators = 12;
constexpr int64_t kIterations = 20000;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Seconds for kIterations rounds of 12 bf16 dot products (16 lanes of bf16 pairs, 64 flops
// each) or, with dot false, of 12 f32 FMAs (16 lanes, 32 flops each).
__attribute__((target("avx512f,avx512bf16"))) double time_rounds(bool dot, float* sink) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
  const __m512bh one = (__m512bh)_mm512_set1_epi16(0x3f80), small = (__m512bh)_mm512_set1_epi16(0x3a83);  // 1, 1e-3
  const auto start = std::chrono::steady_clock::now();
  if (dot) {
    for (int64_t n = 0; n < kIterations; ++n) {
#pragma GCC unroll 12
      for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], one, small);
    }
  } else {
    for (int64_t n = 0; n < kIterations; ++n) {
#pragma GCC unroll 12
      for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
    }
  }
  const double s = seconds_since(start);
  alignas(64) float lanes[16];
  for (int i = 0; i < kAccumulators; ++i) {
    _mm512_store_ps(lanes, acc[i]);
    *sink += lanes[i];
  }
  return s;
}

}  // namespace

double measure_bf16_dot_rate() {
  float sink = 0.f;
  double fma = 1e30, dot = 1e30;
  // Interleaved, so a clock ramping up or a wide-vector warm-up hits both alike; the first
  // round warms up and still counts only if it is the best.
  for (int round = 0; round < 6; ++round) {
    fma = std::min(fma, time_rounds(false, &sink));
    dot = std::min(dot, time_rounds(true, &sink));
  }
  volatile float keep = sink;  // the loops' results are used, so they are not removed
  (void)keep;
  const double fma_flops = double(kIterations) * kAccumulators * 32, dot_flops = double(kIterations) * kAccumulators * 64;
  return (dot_flops / dot) / (fma_flops / fma);
}

}  // namespace mt::cpu
