#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#if defined(__F16C__)
#include <immintrin.h>
#endif

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
// The same conversions on F16C's instructions where the compiler targets them (the default
// x86-64-v3 build does), so kernels over f16 storage inline and vectorize them. The rounding
// is given in the instruction (not MXCSR's mode) and F16C neither flushes half subnormals nor
// drops a NaN's payload, so both paths give the same bits (DType.F16ConversionsMatchTheReference
// checks every half and 2^24 floats). `static`: C++ TUs compiled with F16C and nvcc's host
// code compiled without it each keep their own copy instead of sharing one inline symbol.
static inline float f16_to_f32(f16 v) {
#if defined(__F16C__)
  return _cvtsh_ss(v.bits);
#else
  return f16_to_f32_portable(v);
#endif
}
static inline f16 f32_to_f16(float f) {
#if defined(__F16C__)
  return f16{uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT))};
#else
  return f32_to_f16_portable(f);
#endif
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
