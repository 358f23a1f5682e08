// Elementwise kernels: unary, binary with broadcasting, where, cast, the fused ReLU/GeLU
// backwards and fills. The op is a kernel argument (one uniform branch per element) rather
// than a template parameter: the kernels are memory-bound, and one instance per dtype keeps
// the build small.
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "meshtrain/backend/cpu/broadcast_iter.h"
#include "meshtrain/backend/cuda/chunk_sums.cuh"
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/elementwise.h"

namespace mt::cuda {

using kernels::BinaryOp;
using kernels::UnaryOp;

namespace {

constexpr float kSqrt1_2 = 0.70710678118654752440f;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;

template <class C>
__device__ inline C apply_unary(UnaryOp op, C x) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::abs: return x < C(0) ? -x : x;
    case UnaryOp::sign: return C((x > C(0)) - (x < C(0)));
    case UnaryOp::relu: return x > C(0) ? x : C(0);
    case UnaryOp::square: return x * x;
    case UnaryOp::logical_not: return C(x == C(0));
    default: break;
  }
  if constexpr (std::is_same_v<C, float>) {
    switch (op) {
      case UnaryOp::exp: return expf(x);
      case UnaryOp::log: return logf(x);
      case UnaryOp::sqrt: return sqrtf(x);
      case UnaryOp::rsqrt: return 1.0f / sqrtf(x);
      case UnaryOp::tanh: return tanhf(x);
      case UnaryOp::sigmoid: return 1.0f / (1.0f + expf(-x));
      case UnaryOp::silu: return x / (1.0f + expf(-x));
      case UnaryOp::gelu_erf: return 0.5f * x * (1.0f + erff(x * kSqrt1_2));
      case UnaryOp::gelu_tanh: return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
      case UnaryOp::erf: return erff(x);
      case UnaryOp::sin: return sinf(x);
      case UnaryOp::cos: return cosf(x);
      case UnaryOp::reciprocal: return 1.0f / x;
      default: break;
    }
  }
  return x;
}

template <class C>
__device__ inline C apply_binary(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::pow:
      if constexpr (std::is_same_v<C, float>) return powf(a, b);
      else return C(pow(double(a), double(b)));
    // NaN propagates like torch.maximum / torch.minimum.
    case BinaryOp::maximum: return (a != a || a > b) ? a : b;
    case BinaryOp::minimum: return (a != a || a < b) ? a : b;
    case BinaryOp::eq: return C(a == b);
    case BinaryOp::ne: return C(a != b);
    case BinaryOp::lt: return C(a < b);
    case BinaryOp::le: return C(a <= b);
    case BinaryOp::gt: return C(a > b);
    case BinaryOp::ge: return C(a >= b);
    case BinaryOp::logical_and: return C(a != C(0) && b != C(0));
    case BinaryOp::logical_or: return C(a != C(0) || b != C(0));
  }
  return a;
}

// Element offset of flat output index i in operand k.
__device__ inline int64_t offset_of(const Strided& s, int k, int64_t i) {
  int64_t off = 0;
  for (int d = s.ndim - 1; d >= 0; --d) {
    const int64_t c = i % s.dims[d];
    i /= s.dims[d];
    off += c * s.strides[k][d];
  }
  return off;
}

// How an operand's offset follows from the flat output index: the common broadcasts (a
// scalar, a bias repeated along rows, a column repeated along a row) cost one division at
// most instead of one per dim.
enum class Access : int { same, scalar, modulo, divide, general };
struct OperandAccess {
  Access mode[4] = {Access::same, Access::same, Access::same, Access::same};
  int64_t m[4] = {1, 1, 1, 1};
};

__device__ inline int64_t operand_offset(const OperandAccess& a, const Strided& s, int k, int64_t i) {
  switch (a.mode[k]) {
    case Access::same: return i;
    case Access::scalar: return 0;
    case Access::modulo: return index_mod(i, a.m[k]);
    case Access::divide: return index_div(i, a.m[k]);
    default: return offset_of(s, k, i);
  }
}

OperandAccess access_for(const Strided& s, int operands) {
  OperandAccess a;
  std::vector<int64_t> contiguous(size_t(s.ndim), 1);
  for (int d = s.ndim - 2; d >= 0; --d) contiguous[size_t(d)] = contiguous[size_t(d) + 1] * s.dims[d + 1];
  for (int k = 0; k < operands; ++k) {
    a.mode[k] = Access::general;
    bool same = true, zero = true;
    for (int d = 0; d < s.ndim; ++d) {
      same = same && (s.strides[k][d] == contiguous[size_t(d)] || s.dims[d] == 1);
      zero = zero && (s.strides[k][d] == 0 || s.dims[d] == 1);
    }
    if (same) {
      a.mode[k] = Access::same;
      continue;
    }
    if (zero) {
      a.mode[k] = Access::scalar;
      continue;
    }
    for (int p = 1; p < s.ndim; ++p) {
      int64_t tail = 1;
      for (int d = p; d < s.ndim; ++d) tail *= s.dims[d];
      bool prefix_zero = true, suffix_contiguous = true, prefix_contiguous = true, suffix_zero = true;
      for (int d = 0; d < p; ++d) {
        prefix_zero = prefix_zero && s.strides[k][d] == 0;
        prefix_contiguous = prefix_contiguous && s.strides[k][d] == contiguous[size_t(d)] / tail;
      }
      for (int d = p; d < s.ndim; ++d) {
        suffix_contiguous = suffix_contiguous && s.strides[k][d] == contiguous[size_t(d)];
        suffix_zero = suffix_zero && s.strides[k][d] == 0;
      }
      if (prefix_zero && suffix_contiguous) {
        a.mode[k] = Access::modulo;
        a.m[k] = tail;
        break;
      }
      if (prefix_contiguous && suffix_zero) {
        a.mode[k] = Access::divide;
        a.m[k] = tail;
        break;
      }
    }
  }
  return a;
}

Strided strided_for(const Shape& out, const std::vector<Shape>& inputs, const char* op) {
  const cpu::BroadcastPlan plan = cpu::make_broadcast_plan(out, inputs);
  MT_CHECK(plan.dims.size() <= size_t(kMaxDims), "[", op, "] more than ", kMaxDims,
           " non-mergeable broadcast dims on the GPU: ", out.str());
  Strided s;
  s.ndim = int(plan.dims.size());
  for (int d = 0; d < s.ndim; ++d) {
    s.dims[d] = plan.dims[size_t(d)];
    for (size_t k = 0; k < inputs.size(); ++k) s.strides[k][d] = plan.strides[k][size_t(d)];
  }
  return s;
}

template <class T, class O>
__global__ void unary_kernel(UnaryOp op, const T* x, O* out, int64_t n) {
  MT_GRID_LOOP(i, n) out[i] = store<O>(apply_unary(op, load(x[i])));
}

template <class T, class O>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, O* out, int64_t n, Strided s, OperandAccess acc) {
  MT_GRID_LOOP(i, n) {
    const int64_t ia = operand_offset(acc, s, 0, i), ib = operand_offset(acc, s, 1, i);
    out[i] = store<O>(apply_binary(op, load(a[ia]), load(b[ib])));
  }
}

// Four consecutive elements (i % 4 == 0) of an f32 operand: one float4 where the operand is
// the output's shape or repeats a row of a multiple-of-4 length, one value broadcast where it
// is a scalar or repeats each element over a multiple-of-4 run.
__device__ inline float4 fetch4(const float* p, const OperandAccess& acc, int k, int64_t i) {
  switch (acc.mode[k]) {
    case Access::same: return reinterpret_cast<const float4*>(p)[i / 4];
    case Access::modulo: return reinterpret_cast<const float4*>(p)[index_mod(i, acc.m[k]) / 4];
    case Access::divide: {
      const float v = p[index_div(i, acc.m[k])];
      return make_float4(v, v, v, v);
    }
    default: {
      const float v = p[0];
      return make_float4(v, v, v, v);
    }
  }
}

// f32 arithmetic four elements per thread: the residual and bias adds of a transformer are
// memory-bound, and 16-byte accesses move the same bytes with a quarter of the instructions.
__global__ void binary_f32x4_kernel(BinaryOp op, const float* a, const float* b, float* out, int64_t n4,
                                    OperandAccess acc) {
  MT_GRID_LOOP(i4, n4) {
    const float4 x = fetch4(a, acc, 0, 4 * i4), y = fetch4(b, acc, 1, 4 * i4);
    reinterpret_cast<float4*>(out)[i4] = make_float4(apply_binary(op, x.x, y.x), apply_binary(op, x.y, y.y),
                                                     apply_binary(op, x.z, y.z), apply_binary(op, x.w, y.w));
  }
}

// bf16 arithmetic eight elements per thread on operands of the output's own shape (a bf16
// step's cotangent sums at the residual stream, and its gradient scalings): 16-byte accesses,
// as binary_f32x4_kernel, each element computed in f32 and rounded as binary_kernel does.
__global__ void binary_bf16x8_kernel(BinaryOp op, const uint4* a, const uint4* b, uint4* out, int64_t n8) {
  MT_GRID_LOOP(i8, n8) {
    const uint4 x = a[i8], y = b[i8];
    bf16_t xs[8], ys[8], o[8];
    memcpy(xs, &x, sizeof(x));
    memcpy(ys, &y, sizeof(y));
#pragma unroll
    for (int q = 0; q < 8; ++q) o[q] = store<bf16_t>(apply_binary(op, load(xs[q]), load(ys[q])));
    uint4 r;
    memcpy(&r, o, sizeof(r));
    out[i8] = r;
  }
}

// Whether every pointer is 16-byte aligned.
bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Whether binary_f32x4_kernel takes the operands: no general strides, periods multiples of 4,
// the element count a multiple of 4 and 16-byte aligned addresses.
bool takes_f32x4(const OperandAccess& acc, int64_t n, std::initializer_list<const void*> pointers) {
  if (n % 4 != 0) return false;
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  for (int k = 0; k < 2; ++k) {
    if (acc.mode[k] == Access::general) return false;
    if ((acc.mode[k] == Access::modulo || acc.mode[k] == Access::divide) && acc.m[k] % 4 != 0) return false;
  }
  return true;
}

template <class T>
__global__ void where_kernel(const bool* c, const T* a, const T* b, T* out, int64_t n, Strided s, OperandAccess acc) {
  MT_GRID_LOOP(i, n) {
    out[i] = c[operand_offset(acc, s, 0, i)] ? a[operand_offset(acc, s, 1, i)] : b[operand_offset(acc, s, 2, i)];
  }
}

template <class T>
__global__ void relu_backward_kernel(const T* x, const T* g, T* out, int64_t n) {
  MT_GRID_LOOP(i, n) out[i] = load(x[i]) > compute_t<T>(0) ? g[i] : store<T>(compute_t<T>(0));
}

__device__ inline float gelu_derivative(float v, bool approximate) {
  if (approximate) {
    constexpr float c = 0.044715f;
    const float t = tanhf(kSqrt2OverPi * (v + c * v * v * v));
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * c * v * v);
  }
  return 0.5f * (1.0f + erff(v * kSqrt1_2)) + v * 0.39894228040143267794f * expf(-0.5f * v * v);
}

template <class T>
__global__ void gelu_backward_kernel(const T* x, const T* g, T* out, int64_t n, bool approximate) {
  MT_GRID_LOOP(i, n) out[i] = from_f32<T>(to_f32(g[i]) * gelu_derivative(to_f32(x[i]), approximate));
}

// The linear layer's epilogue: out = act(y + bias), the pre-activation rounded to T as the
// composed add rounds it.
template <class T, class B>
__global__ void bias_activation_kernel(UnaryOp act, const T* y, const B* bias, T* out, int64_t n, int64_t c) {
  MT_GRID_LOOP(i, n) {
    const float pre = to_f32(from_f32<T>(to_f32(y[i]) + to_f32(bias[index_mod(i, c)])));
    out[i] = from_f32<T>(apply_unary(act, pre));
  }
}

template <class T, class B>
__global__ void bias_activation_backward_kernel(UnaryOp act, const T* y, const B* bias, const T* g, T* dpre,
                                                int64_t n, int64_t c) {
  MT_GRID_LOOP(i, n) {
    const float pre = to_f32(from_f32<T>(to_f32(y[i]) + to_f32(bias[index_mod(i, c)])));
    const float gv = to_f32(g[i]);
    dpre[i] = from_f32<T>(act == UnaryOp::relu ? (pre > 0.0f ? gv : 0.0f)
                                               : gv * gelu_derivative(pre, act == UnaryOp::gelu_tanh));
  }
}

// Column sums of dpre (N, C) per 64-row chunk in f64, then over chunks in order: the CPU
// kernel's summation order, deterministic.
template <class T>
__global__ void column_chunk_sums_kernel(const T* d, double* part, int64_t n, int64_t c) {
  const int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= c) return;
  const int64_t ch = blockIdx.x, r0 = ch * kRowChunk, r1 = min(n, r0 + kRowChunk);
  double s = 0;
  for (int64_t r = r0; r < r1; ++r) s += double(to_f32(d[r * c + i]));
  part[ch * c + i] = s;
}

void check_fused_activation(UnaryOp act) {
  MT_CHECK(act == UnaryOp::relu || act == UnaryOp::gelu_erf || act == UnaryOp::gelu_tanh,
           "[bias_activation] activation ", kernels::unary_name(act), " is not fused (relu, gelu, gelu_tanh are)");
}

template <class I, class O>
__global__ void cast_kernel(const I* x, O* out, int64_t n) {
  MT_GRID_LOOP(i, n) {
    if constexpr (std::is_same_v<I, O>) out[i] = x[i];
    else if constexpr (std::is_same_v<O, bool>) out[i] = load_double(x[i]) != 0.0;
    else if constexpr (is_float_v<O>) out[i] = from_f32<O>(float(load_double(x[i])));
    else if constexpr (is_float_v<I>) out[i] = O(to_f32(x[i]));  // truncates like torch
    else out[i] = O(x[i]);
  }
}

template <class W>
__global__ void fill_kernel(W* dst, W value, int64_t n) {
  MT_GRID_LOOP(i, n) dst[i] = value;
}

__global__ void round_to_bf16_kernel(const float* src, bf16_t* dst, int64_t n) {
  MT_GRID_LOOP(i, n) dst[i] = from_f32<bf16_t>(src[i]);
}

}  // namespace

void round_f32_to_bf16(const float* src, void* dst, int64_t n) {
  if (n == 0) return;
  round_to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(src, static_cast<bf16_t*>(dst), n);
  check_launch("round_to_bf16");
}

namespace {
template <class T>
__global__ void add_bias_rows_kernel(T* c, const T* bias, int64_t n_cols, int64_t n) {
  MT_GRID_LOOP(i, n) c[i] = from_f32<T>(to_f32(c[i]) + to_f32(bias[index_mod(i, n_cols)]));
}
}  // namespace

void add_bias_rows(DType dtype, void* c, const void* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  dispatch_device_float(dtype, "matmul bias", [&](auto type) {
    using T = decltype(type);
    add_bias_rows_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(static_cast<T*>(c), static_cast<const T*>(bias),
                                                                     cols, n);
    check_launch("matmul bias");
  });
}

void fill_pattern(void* dst, const void* pattern, size_t pattern_bytes, size_t count) {
  if (count == 0) return;
  if (pattern_bytes == 1) {
    check(cudaMemsetAsync(dst, *static_cast<const uint8_t*>(pattern), count, stream()), "fill");
    return;
  }
  auto launch = [&](auto tag) {
    using W = decltype(tag);
    W v;
    std::memcpy(&v, pattern, sizeof(W));
    fill_kernel<<<blocks_for(int64_t(count)), kThreads, 0, stream()>>>(static_cast<W*>(dst), v, int64_t(count));
  };
  if (pattern_bytes == 2) launch(uint16_t{});
  else if (pattern_bytes == 4) launch(uint32_t{});
  else if (pattern_bytes == 8) launch(uint64_t{});
  else throw Error(detail::concat("[fill] unsupported element size ", pattern_bytes));
  check_launch("fill");
}

void unary(UnaryOp op, const Array& x, Array& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_device(x.dtype(), kernels::unary_name(op), [&](auto tag) {
    using T = decltype(tag);
    if (op == UnaryOp::logical_not)
      unary_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(op, ptr<T>(x), mptr<bool>(out), n);
    else
      unary_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(op, ptr<T>(x), mptr<T>(out), n);
  });
  check_launch(kernels::unary_name(op));
}

void binary(BinaryOp op, const Array& a, const Array& b, Array& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool same = a.shape() == out.shape() && b.shape() == out.shape();
  const Strided s = same ? Strided{} : strided_for(out.shape(), {a.shape(), b.shape()}, kernels::binary_name(op));
  const OperandAccess acc = same ? OperandAccess{} : access_for(s, 2);
  if (a.dtype() == DType::f32 && !kernels::is_comparison(op) && takes_f32x4(acc, n, {a.raw(), b.raw(), out.raw()})) {
    binary_f32x4_kernel<<<blocks_for(n / 4), kThreads, 0, stream()>>>(op, ptr<float>(a), ptr<float>(b),
                                                                      mptr<float>(out), n / 4, acc);
    check_launch(kernels::binary_name(op));
    return;
  }
  if (a.dtype() == DType::bf16 && same && !kernels::is_comparison(op) && n % 8 == 0 &&
      aligned16({a.raw(), b.raw(), out.raw()})) {
    binary_bf16x8_kernel<<<blocks_for(n / 8), kThreads, 0, stream()>>>(
        op, static_cast<const uint4*>(a.raw()), static_cast<const uint4*>(b.raw()), static_cast<uint4*>(out.raw()),
        n / 8);
    check_launch(kernels::binary_name(op));
    return;
  }
  dispatch_device(a.dtype(), kernels::binary_name(op), [&](auto tag) {
    using T = decltype(tag);
    if (kernels::is_comparison(op))
      binary_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(op, ptr<T>(a), ptr<T>(b), mptr<bool>(out), n, s, acc);
    else
      binary_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(op, ptr<T>(a), ptr<T>(b), mptr<T>(out), n, s, acc);
  });
  check_launch(kernels::binary_name(op));
}

void where(const Array& cond, const Array& a, const Array& b, Array& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool same = cond.shape() == out.shape() && a.shape() == out.shape() && b.shape() == out.shape();
  const Strided s = same ? Strided{} : strided_for(out.shape(), {cond.shape(), a.shape(), b.shape()}, "where");
  const OperandAccess acc = same ? OperandAccess{} : access_for(s, 3);
  dispatch_device(a.dtype(), "where", [&](auto tag) {
    using T = decltype(tag);
    where_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<bool>(cond), ptr<T>(a), ptr<T>(b), mptr<T>(out), n, s,
                                                            acc);
  });
  check_launch("where");
}

void relu_backward(const Array& x, const Array& g, Array& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_device(x.dtype(), "relu", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) throw Error("[relu] no gradient for bool arrays");
    else relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<T>(x), ptr<T>(g), mptr<T>(out), n);
  });
  check_launch("relu_backward");
}

void gelu_backward(const Array& x, const Array& g, bool approximate, Array& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_device_float(x.dtype(), "gelu", [&](auto tag) {
    using T = decltype(tag);
    gelu_backward_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<T>(x), ptr<T>(g), mptr<T>(out), n, approximate);
  });
  check_launch("gelu_backward");
}

void cast(const Array& x, Array& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_device(x.dtype(), "cast", [&](auto in_tag) {
    using I = decltype(in_tag);
    dispatch_device(out.dtype(), "cast", [&](auto out_tag) {
      using O = decltype(out_tag);
      cast_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<I>(x), mptr<O>(out), n);
    });
  });
  check_launch("cast");
}

void bias_activation(UnaryOp act, const Array& y, const Array& bias, Array& out) {
  check_fused_activation(act);
  const int64_t n = y.numel(), c = y.dim(-1);
  if (n == 0) return;
  dispatch_device_float(y.dtype(), "bias_activation", [&](auto yt) {
    dispatch_device_float(bias.dtype(), "bias_activation", [&](auto bt) {
      using T = decltype(yt);
      using B = decltype(bt);
      bias_activation_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(act, ptr<T>(y), ptr<B>(bias), mptr<T>(out), n, c);
    });
  });
  check_launch("bias_activation");
}

void bias_activation_backward(UnaryOp act, const Array& y, const Array& bias, const Array& g, Array& dpre,
                              Array* dbias) {
  check_fused_activation(act);
  const int64_t n = y.numel(), c = y.dim(-1);
  if (n == 0) return;
  const int64_t rows = n / c, chunks = (rows + kRowChunk - 1) / kRowChunk;
  dispatch_device_float(y.dtype(), "bias_activation", [&](auto yt) {
    dispatch_device_float(bias.dtype(), "bias_activation", [&](auto bt) {
      using T = decltype(yt);
      using B = decltype(bt);
      bias_activation_backward_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(act, ptr<T>(y), ptr<B>(bias), ptr<T>(g),
                                                                                mptr<T>(dpre), n, c);
      check_launch("bias_activation_backward");
      if (!dbias) return;
      // Scratch for f64 partial sums: 8-byte elements (there is no f64 dtype; i64 has the size).
      Array part = Array::empty({chunks, c}, DType::i64, y.device());
      double* pp = static_cast<double*>(part.raw());
      const dim3 grid(unsigned(chunks), unsigned((c + kThreads - 1) / kThreads));
      column_chunk_sums_kernel<<<grid, kThreads, 0, stream()>>>(ptr<T>(dpre), pp, rows, c);
      check_launch("bias_activation_backward");
      dispatch_device_float(dbias->dtype(), "bias_activation", [&](auto ot) {
        using O = decltype(ot);
        sum_chunks_kernel<<<blocks_for(c), kThreads, 0, stream()>>>(pp, mptr<O>(*dbias), chunks, c);
      });
      check_launch("bias_activation_backward");
    });
  });
}

}  // namespace mt::cuda
