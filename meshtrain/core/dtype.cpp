#include "meshtrain/core/dtype.h"

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

float f16_to_f32(f16 v) {
  uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t mant = v.bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: renormalize into an f32 normal
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      out = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | mant << 13;
  } else {
    out = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

f16 f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // overflow (after rounding) -> inf
  if (abs < 0x38800000u) {  // result is subnormal or zero in half precision
    if (abs < 0x33000000u) return f16{sign};
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    int shift = 126 - int(abs >> 23);  // 14 + (113 - exp)
    uint32_t half = mant >> (shift);
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return f16{uint16_t(sign | half)};
  }
  uint32_t e = (abs >> 23) - 127 + 15;
  uint32_t mant = abs & 0x7fffffu;
  uint32_t h = e << 10 | mant >> 13;
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return f16{uint16_t(sign | h)};
}

}  // namespace mt
