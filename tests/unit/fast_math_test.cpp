// The branch-free f32 exp / tanh / erf used by the CPU kernels, against libm in double
// rounded to f32, over every 64th float in their working ranges: the error in ulps of the
// correctly rounded result.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>

#include "meshtrain/backend/cpu/fast_math.h"

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// |got − exact| in units of the spacing of floats at the exact value.
double ulps(float got, double exact) {
  const float rounded = float(exact);
  const double spacing = std::nextafter(std::fabs(rounded), std::numeric_limits<float>::infinity()) - std::fabs(rounded);
  return std::fabs(double(got) - exact) / (spacing > 0 ? spacing : 1e-45);
}

// The worst error of f against reference over the floats of [lo, hi] (both signs when lo = 0).
template <class F, class R>
double worst_ulps(F f, R reference, float lo, float hi, float* where) {
  double worst = 0;
  for (int sign = 0; sign < 2; ++sign) {
    uint32_t start, stop;
    float a = lo, b = hi;
    std::memcpy(&start, &a, 4);
    std::memcpy(&stop, &b, 4);
    for (uint32_t bits = start; bits <= stop; bits += 64) {
      const float x = sign ? -from_bits(bits) : from_bits(bits);
      const double e = ulps(f(x), reference(double(x)));
      if (e > worst) worst = e, *where = x;
    }
  }
  return worst;
}

TEST(FastMath, ErfIsWithinTwoUlps) {
  float where = 0;
  const double worst =
      worst_ulps([](float x) { return mt::cpu::fast_erf(x); }, [](double x) { return std::erf(x); }, 1e-30f, 6.0f, &where);
  std::printf("fast_erf: max error %.2f ulp at %.9g\n", worst, double(where));
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(mt::cpu::fast_erf(0.0f), 0.0f);
  EXPECT_EQ(mt::cpu::fast_erf(INFINITY), 1.0f);
  EXPECT_EQ(mt::cpu::fast_erf(-INFINITY), -1.0f);
  EXPECT_TRUE(std::isnan(mt::cpu::fast_erf(NAN)));
}

TEST(FastMath, ExpAndTanhAreWithinTwoUlps) {
  float where = 0;
  double worst = worst_ulps([](float x) { return mt::cpu::fast_exp(x); }, [](double x) { return std::exp(x); },
                            1e-30f, 87.0f, &where);
  std::printf("fast_exp: max error %.2f ulp at %.9g\n", worst, double(where));
  EXPECT_LE(worst, 2.0);
  worst = worst_ulps([](float x) { return mt::cpu::fast_tanh(x); }, [](double x) { return std::tanh(x); }, 1e-30f,
                     12.0f, &where);
  std::printf("fast_tanh: max error %.2f ulp at %.9g\n", worst, double(where));
  EXPECT_LE(worst, 3.0);
}

}  // namespace
