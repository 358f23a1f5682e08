#pragma once
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>

namespace mt {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, boolean };
inline constexpr int kNumDTypes = int(DType::boolean) + 1;  // keep boolean last

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
DType dtype_from_name(const std::string& name);  // "f32", "bf16", ... ; throws mt::Error
inline bool is_floating(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }
inline bool is_integer(DType d) { return d == DType::i32 || d == DType::i64; }

// bfloat16 storage: the upper 16 bits of an IEEE f32, rounded to nearest even.
struct bf16 {
  uint16_t bits;
};
// IEEE half precision storage.
struct f16 {
  uint16_t bits;
};

inline float bf16_to_f32(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Nearest even; a NaN stays a (quiet) NaN. Branch-free (a select, not an early return), so
// the kernels' `omp simd` loops that store bf16 through it vectorize.
inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return bf16{uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}
// IEEE half conversions written out in integer arithmetic (nearest even, subnormals kept, a NaN
// stays a quiet NaN with its high payload bits): the reference, and the path without F16C.
float f16_to_f32_portable(f16 v);
f16 f32_to_f16_portable(float f);
// The same conversions, branch-free, in integer and f32 arithmetic the compiler vectorizes:
// a kernel loop over f16 storage (compiled with -fno-trapping-math, as backend/cpu is, so
// both sides of each select may be computed) converts 8 or 16 elements an instruction, as it
// does bf16's. F16C's scalar instructions looked the natural choice but GCC keeps every loop
// that calls them scalar (an element a call: f16 elementwise steps ran at half bf16's speed).
// Both give the reference's bits, NaN payloads included (DType.F16ConversionsMatchTheReference
// checks every half and 2^24 floats). They assume MXCSR's default rounding (nearest even); a
// flush-to-zero or denormals-are-zero mode changes no result (an f32 subnormal rounds to a
// half zero anyway, and the subnormal halves are made from normal f32 sums). `static`: C++
// TUs and nvcc's host code each keep their own copy.
static inline float f16_to_f32(f16 v) {
  const uint32_t h = v.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t em = (h & 0x7fffu) << 13;  // exponent and mantissa moved to f32's places
  const uint32_t exp = em & 0x0f800000u;
  const uint32_t normal = em + (112u << 23);  // rebias 15 -> 127
  // inf and NaN: exponent 255; a NaN comes out quiet, its payload kept, as F16C gives it.
  const uint32_t inf_nan = (em + (224u << 23)) | ((em & 0x7fffffu) ? 0x400000u : 0u);
  // subnormal (and zero): (2^-14 + m * 2^-24) - 2^-14, exact in f32.
  const uint32_t sub =
      std::bit_cast<uint32_t>(std::bit_cast<float>(em + (113u << 23)) - std::bit_cast<float>(113u << 23));
  const uint32_t mag = exp == 0x0f800000u ? inf_nan : (exp == 0 ? sub : normal);
  return std::bit_cast<float>(mag | sign);
}
static inline f16 f32_to_f16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t u = bits & 0x7fffffffu;
  // normal halves: nearest even on the 13 dropped bits, rebias 127 -> 15 (a carry into the
  // exponent is right, up to 65520 and beyond rounding to inf).
  const uint32_t normal = (u - 0x38000000u + 0xfffu + ((u >> 13) & 1u)) >> 13;
  // subnormal halves: adding 0.5 (whose ulp is 2^-24, a half subnormal's unit) rounds |f| to
  // a count of units in the f32 adder, nearest even; 1024 units is the smallest normal half.
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(u) + 0.5f) - 0x3f000000u;
  const uint32_t nan = 0x7e00u | ((u >> 13) & 0x3ffu);  // quiet, high payload bits kept
  const uint32_t r = u > 0x7f800000u ? nan : (u >= 0x477ff000u ? 0x7c00u : (u < 0x38800000u ? sub : normal));
  return f16{uint16_t(r | sign)};
}
// Bulk conversions with the rounding above, as branch-free loops the compiler vectorizes
// (serial: callers that want threads split the range; the comm thread must not spawn any).
void bf16_to_f32_n(const uint16_t* src, float* dst, int64_t n);  // (n,) -> (n,)
void f32_to_bf16_n(const float* src, uint16_t* dst, int64_t n);  // (n,) -> (n,)
// f32 values rounded to the nearest bf16 but kept as f32 (bf16's bits << 16).
void f32_round_to_bf16_n(const float* src, float* dst, int64_t n);  // (n,) -> (n,)
void f16_to_f32_n(const uint16_t* src, float* dst, int64_t n);  // (n,) -> (n,)
void f32_to_f16_n(const float* src, uint16_t* dst, int64_t n);  // (n,) -> (n,), nearest even
// The most negative finite value of a floating dtype (a "minus infinity" that keeps
// softmax of a fully masked row finite).
double lowest_finite(DType dtype);

}  // namespace mt
