#pragma once
// Branch-free f32 exp and tanh. std::exp / std::tanh are scalar libm calls that block
// vectorization of kernel loops; these use selects and polynomials only, so `omp simd`
// loops vectorize. Accuracy: ~1-2 ulp.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace mt::cpu {

// exp(x) = 2^n · e^r with r = x − n·ln2 (ln2 split in two so n·ln2 is exact) and e^r by a
// degree-6 minimax polynomial on [−ln2/2, ln2/2]. 0 below −87.3 (so −inf gives 0),
// inf above 88.72, NaN stays NaN.
inline float fast_exp(float x) {
  const float xc = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
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

}  // namespace mt::cpu
