#include "meshtrain/core/dtype.h"

#include <bit>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "meshtrain/core/error.h"

namespace mt {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::boolean: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean})
    if (name == dtype_name(d)) return d;
  throw Error("[dtype] unknown dtype '" + name + "' (expected f32, bf16, f16, i32, i64 or bool)");
}

double lowest_finite(DType dtype) {
  switch (dtype) {
    case DType::bf16: return -3.3895313892515355e38;  // 0xff7f
    case DType::f16: return -65504.0;
    default: return -3.4028234663852886e38;
  }
}

// Bit-exact conversions, independent of FPU rounding and flush-to-zero modes.
float f16_to_f32_portable(f16 v) {
  const uint16_t h = v.bits;
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  // inf; a NaN comes out quiet, its payload kept, as F16C's conversion gives it.
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  if (exp == 0) {
    // Subnormal: mant * 2^-24 is exact in f32 (and a normal f32), so a multiply suffices.
    const float mag = float(mant) * 0x1p-24f;
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));  // rebias 15 -> 127
}

f16 f32_to_f16_portable(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) {  // inf stays inf; NaN stays a (quiet) NaN keeping high payload bits
    return f16{mag == 0x7f800000u ? uint16_t(sign | 0x7c00u) : uint16_t(sign | 0x7e00u | ((mag >> 13) & 0x3ffu))};
  }
  if (mag >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // >= 65520 rounds past 65504
  if (mag >= 0x38800000u) {                                  // normal half range, >= 2^-14
    mag += 0xfffu + ((mag >> 13) & 1u);  // round to nearest even on the 13 dropped bits
    return f16{uint16_t(sign | ((mag - 0x38000000u) >> 13))};  // rebias 127 -> 15; carry is fine
  }
  // Subnormal half: the result counts units of 2^-24.
  const uint32_t e = mag >> 23;
  if (e < 102) return f16{uint16_t(sign)};  // below 2^-25 (incl. f32 subnormals): rounds to zero
  const uint32_t m = (mag & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // in [14, 24]
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal
  return f16{uint16_t(sign | q)};
}

void bf16_to_f32_n(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(src[i]) << 16;
    std::memcpy(&dst[i], &u, 4);
  }
}

namespace {
// f32 bits -> bf16 bits: f32_to_bf16's rounding (branch-free, so the bulk loops vectorize).
inline uint32_t bf16_bits_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f32_to_bf16(f).bits;
}
}  // namespace

void f32_to_bf16_n(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &src[i], 4);
    dst[i] = uint16_t(bf16_bits_of(u));
  }
}

void f32_round_to_bf16_n(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &src[i], 4);
    const uint32_t r = bf16_bits_of(u) << 16;
    std::memcpy(&dst[i], &r, 4);
  }
}

void f16_to_f32_n(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(f16{src[i]});
}

void f32_to_f16_n(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]).bits;
}

}  // namespace mt
