#pragma once
// Branch-free f32 exp and tanh, and rounding to a 16-bit float's precision. std::exp / std::tanh are scalar libm calls that block
// vectorization of kernel loops; these use selects and polynomials only, so `omp simd`
// loops vectorize. Accuracy: ~1-2 ulp.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "meshtrain/core/element.h"

namespace mt::cpu {

// exp(x) = 2^n · e^r with r = x − n·ln2 (ln2 split in two so n·ln2 is exact) and e^r by a
// degree-6 minimax polynomial on [−ln2/2, ln2/2]. 0 below −87.3 (so −inf gives 0),
// inf above 88.72, NaN stays NaN.
inline float fast_exp(float x) {
  const float xc = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  // n = round(x / ln2) by adding and subtracting 1.5 · 2^23 (which leaves no fraction bits):
  // std::floor compiles to a libm call at -march=x86-64-v3 without -ffast-math, and that
  // call kept every loop using fast_exp scalar.
  constexpr float kRoundingShift = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + kRoundingShift) - kRoundingShift;
  float r = xc - n * 0.693359375f;
  r -= n * -2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  float y = p * scale;
  y = x < -87.3f ? 0.0f : y;
  y = x > 88.7228f ? INFINITY : y;
  return x != x ? x : y;
}

// tanh: an odd polynomial near 0 (where 1 − e^{−2|x|} would cancel), the exp form
// elsewhere; saturates to ±1 beyond |x| > 9.
inline float fast_tanh(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = x + x * z * p;
  const float e = fast_exp(-2.0f * (a > 9.0f ? 9.0f : a));
  const float big = std::copysign((1.0f - e) / (1.0f + e), x);
  return a < 0.625f ? small : big;
}

inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

// erf, branch-free (libm's erff is a scalar call). Below |x| = 0.875: x + x · P(x²), P fitted
// to erf(x)/x − 1 (the exact leading x keeps the rounding error under 1 ulp). Above: 1 − exp(Q(|x| − 2.4375)), Q a degree-8 least-squares
// fit of log erfc on [0.875, 4] (error 1.2e-8); |x| is clamped to 4, where erfc(4) = 1.5e-8
// rounds 1 − erfc to 1. Fitted here with numpy against Python's math.erf / math.erfc; within
// 2 ulp of the correctly rounded erf over [−4.5, 4.5] (tests/unit/fast_math_test.cpp).
inline float fast_erf(float x) {
  const float a = std::fabs(x);
  const float z = a * a;
  float s = -6.262603565119207e-4f;
  s = s * z + 5.0441185012459755e-3f;
  s = s * z - 2.6800045743584633e-2f;
  s = s * z + 1.1282717436552048e-1f;
  s = s * z - 3.761258125305176e-1f;
  s = s * z + 1.2837916612625122e-1f;
  const float t = (a > 4.0f ? 4.0f : a) - 2.4375f;
  float q = 1.6054226534834015e-6f;
  q = q * t - 1.410911681887228e-5f;
  q = q * t + 8.342992805410177e-5f;
  q = q * t - 4.503075615502894e-4f;
  q = q * t + 2.301059663295746e-3f;
  q = q * t - 1.1416577734053135e-2f;
  q = q * t - 9.418058395385742e-1f;
  q = q * t - 5.234823226928711f;
  q = q * t - 7.475956916809082f;
  const float big = std::copysign(1.0f - fast_exp(q), x);
  return a < 0.875f ? x * s + x : big;
}

// v rounded to T's precision and kept as f32. For bf16 this vectorizes because f32_to_bf16
// is branch-free; what kept GCC's vectorizer out of the kernels' bf16 loops was a bf16 value
// stored and read back in the same loop, and 16-bit reads under a condition (BERT's bf16
// add_dropout_layer_norm forward ran scalar, 2.2x slower than f32's).
template <class T>
inline float round_to_f32(float v) {
  return load_f32(store_f32<T>(v));
}


}  // namespace mt::cpu
