#pragma once
// Typed element access: dispatch on a runtime DType and convert elements to and from
// double / float, so generic host code can handle every dtype in one place.
#include <cstdint>
#include <type_traits>

#include "meshtrain/core/dtype.h"
#include "meshtrain/core/error.h"

namespace mt {

template <class T>
inline double to_double(T v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16_to_f32(v);
  else if constexpr (std::is_same_v<T, f16>) return f16_to_f32(v);
  else return double(v);
}

template <class T>
inline T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16>) return f32_to_bf16(float(v));
  else if constexpr (std::is_same_v<T, f16>) return f32_to_f16(float(v));
  else if constexpr (std::is_same_v<T, bool>) return v != 0.0;
  else return T(v);
}

// Element <-> f32 compute type; float kernels load/store through these.
template <class T>
inline float load_f32(T v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16_to_f32(v);
  else if constexpr (std::is_same_v<T, f16>) return f16_to_f32(v);
  else return float(v);
}
template <class T>
inline T store_f32(float v) {
  if constexpr (std::is_same_v<T, bf16>) return f32_to_bf16(v);
  else if constexpr (std::is_same_v<T, f16>) return f32_to_f16(v);
  else if constexpr (std::is_same_v<T, bool>) return v != 0.0f;
  else return T(v);
}

template <class F>
decltype(auto) dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(bf16{});
    case DType::f16: return f(f16{});
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    case DType::boolean: return f(bool{});
  }
  throw Error("[dispatch] invalid dtype");
}

template <class F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(bf16{});
    case DType::f16: return f(f16{});
    default: break;
  }
  throw Error(detail::concat("[", op, "] expected a floating dtype (f32, bf16, f16), got ", dtype_name(dtype)));
}

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  else if constexpr (std::is_same_v<T, bf16>) return DType::bf16;
  else if constexpr (std::is_same_v<T, f16>) return DType::f16;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::i32;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::i64;
  else return DType::boolean;
}

}  // namespace mt
