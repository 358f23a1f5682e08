#pragma once
// What every translation unit of the CUDA backend shares (host side): the compute stream,
// error checks, launch shapes, strided-operand descriptions. Device element types are in
// device_types.cuh.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "meshtrain/core/array.h"
#include "meshtrain/core/error.h"

namespace mt::cuda {

// The process's compute stream on its GPU (created on first use).
cudaStream_t stream();
// The device the stream belongs to; arrays on another index are an error.
int active_device();

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* what);
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_cuda_error(e, what);
}
// After a launch: configuration errors (bad grid, missing kernel image for this GPU).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));  // grid-stride loops cover the rest
}

template <class T>
const T* ptr(const Array& a) {
  return static_cast<const T*>(a.raw());
}
template <class T>
T* mptr(Array& a) {
  return static_cast<T*>(a.raw());
}

// Fills `count` elements of `pattern_bytes` (1, 2, 4 or 8) at `dst` (elementwise.cu).
void fill_pattern(void* dst, const void* pattern, size_t pattern_bytes, size_t count);

// dst (n,) bf16 = src (n,) f32 rounded to nearest even (elementwise.cu).
void round_f32_to_bf16(const float* src, void* dst, int64_t n);

// c (rows, cols) += bias (cols,) in f32, rounded to `dtype` (a floating dtype; elementwise.cu):
// matmul_bias where cuBLASLt offers no bias epilogue for a shape.
void add_bias_rows(DType dtype, void* c, const void* bias, int64_t rows, int64_t cols);

// Up to this many dims after coalescing; more is an error naming the op.
constexpr int kMaxDims = 8;
struct Strided {
  int ndim = 0;
  int64_t dims[kMaxDims] = {};
  int64_t strides[4][kMaxDims] = {};  // per operand (up to 4), elements; 0 = broadcast
};

}  // namespace mt::cuda
