#include "meshtrain/backend/elementwise.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "meshtrain/backend/cpu/broadcast_iter.h"
#include "meshtrain/backend/cpu/fast_math.h"
#include "meshtrain/backend/cpu/own_loop.h"
#include "meshtrain/core/element.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

using kernels::UnaryOp;
using kernels::BinaryOp;
using kernels::is_comparison;

namespace {

constexpr float kSqrt1_2 = 0.70710678118654752440f;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;

// gelu'(v): the tanh form's derivative when approximate, else Φ(v) + v·φ(v).
template <bool approximate>
inline float gelu_derivative(float v) {
  if constexpr (approximate) {
    constexpr float c = 0.044715f;
    const float t = fast_tanh(kSqrt2OverPi * (v + c * v * v * v));
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * c * v * v);
  } else {
    constexpr float inv_sqrt_2pi = 0.39894228040143267794f;
    return 0.5f * (1.0f + fast_erf(v * kSqrt1_2)) + v * inv_sqrt_2pi * fast_exp(-0.5f * v * v);
  }
}


// C is the compute type: float for floating dtypes, the integer type itself otherwise.
template <UnaryOp op, class C>
inline C apply_unary(C x) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::abs: return x < C(0) ? -x : x;
    case UnaryOp::sign: return C((x > C(0)) - (x < C(0)));
    case UnaryOp::relu: return x > C(0) ? x : C(0);
    case UnaryOp::square: return x * x;
    case UnaryOp::logical_not: return C(x == C(0));
    default: break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case UnaryOp::exp: return fast_exp(x);
      case UnaryOp::log: return std::log(x);
      case UnaryOp::sqrt: return std::sqrt(x);
      case UnaryOp::rsqrt: return C(1) / std::sqrt(x);
      case UnaryOp::tanh: return fast_tanh(x);
      case UnaryOp::sigmoid: return fast_sigmoid(x);
      case UnaryOp::silu: return x * fast_sigmoid(x);
      case UnaryOp::gelu_erf: return C(0.5) * x * (C(1) + fast_erf(x * kSqrt1_2));
      case UnaryOp::gelu_tanh:
        return C(0.5) * x * (C(1) + fast_tanh(kSqrt2OverPi * (x + C(0.044715) * x * x * x)));
      case UnaryOp::erf: return fast_erf(x);
      case UnaryOp::sin: return std::sin(x);
      case UnaryOp::cos: return std::cos(x);
      case UnaryOp::reciprocal: return C(1) / x;
      default: break;
    }
  }
  return x;
}

template <BinaryOp op, class C>
inline C apply_binary(C a, C b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::pow:
      if constexpr (std::is_floating_point_v<C>) return std::pow(a, b);
      else return C(std::pow(double(a), double(b)));
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

template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16> || std::is_same_v<T, float>,
                                     float, std::conditional_t<std::is_same_v<T, bool>, int32_t, T>>;

template <class T>
inline compute_t<T> load(T v) {
  if constexpr (std::is_same_v<compute_t<T>, float>) return load_f32(v);
  else return compute_t<T>(v);
}
template <class T, class C>
inline T store(C v) {
  if constexpr (std::is_same_v<T, bf16>) return f32_to_bf16(float(v));
  else if constexpr (std::is_same_v<T, f16>) return f32_to_f16(float(v));
  else if constexpr (std::is_same_v<T, bool>) return v != C(0);
  else return T(v);
}

// Expands a runtime op into a call with the op as a template argument, so each kernel
// loop is specialised and vectorizable instead of switching per element.
template <class Enum, Enum... ops, class F>
void dispatch_op(Enum op, F&& f) {
  bool found = ((op == ops ? (f(std::integral_constant<Enum, ops>{}), true) : false) || ...);
  if (!found) throw Error("[elementwise] unknown op");
}

#define MT_ENUM_VALUE(e, ...) , Enum::e
template <class F>
void dispatch_unary(UnaryOp op, F&& f) {
  using Enum = UnaryOp;
  dispatch_op<Enum MT_UNARY_OPS(MT_ENUM_VALUE)>(op, f);
}

template <class F>
void dispatch_binary(BinaryOp op, F&& f) {
  using Enum = BinaryOp;
  dispatch_op<Enum MT_BINARY_OPS(MT_ENUM_VALUE)>(op, f);
}
#undef MT_ENUM_VALUE

// The activations bias_activation fuses, as f(pre) and f'(pre).
template <UnaryOp act>
inline float activation_value(float v) {
  return apply_unary<act, float>(v);
}
template <UnaryOp act>
inline float activation_derivative(float v) {
  return gelu_derivative<act == UnaryOp::gelu_tanh>(v);
}

template <class F>
void dispatch_fused_activation(UnaryOp act, F&& f) {
  switch (act) {
    case UnaryOp::relu: f(std::integral_constant<UnaryOp, UnaryOp::relu>{}); return;
    case UnaryOp::gelu_erf: f(std::integral_constant<UnaryOp, UnaryOp::gelu_erf>{}); return;
    case UnaryOp::gelu_tanh: f(std::integral_constant<UnaryOp, UnaryOp::gelu_tanh>{}); return;
    default: break;
  }
  throw Error(detail::concat("[bias_activation] activation ", kernels::unary_name(act),
                             " is not fused (relu, gelu, gelu_tanh are)"));
}

// Rows per chunk of the bias gradient's partial sums: fixed, so the summation order does not
// depend on the thread count.
constexpr int64_t kBiasRowChunk = 64;

// Calls f(activation tag, y's element type tag, bias as f32 (C,)) for bias_activation's
// kernels: the activation, y's dtype and the bias's dtype (converted once) dispatched.
template <class F>
void with_bias_activation(UnaryOp act, const Array& y, const Array& bias, F&& f) {
  const int64_t c = y.dim(-1);
  std::vector<float> b(static_cast<size_t>(c));
  dispatch_float(bias.dtype(), "bias_activation", [&](auto bt) {
    using B = decltype(bt);
    const B* pb = bias.data<B>();
    for (int64_t i = 0; i < c; ++i) b[size_t(i)] = load_f32(pb[i]);
  });
  dispatch_fused_activation(act, [&](auto act_tag) {
    dispatch_float(y.dtype(), "bias_activation", [&](auto yt) { f(act_tag, yt, b.data()); });
  });
}

}  // namespace

void unary(UnaryOp op, const Array& x, Array& out) {
  const int64_t n = x.numel();
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* px = x.data<T>();
    if (op == UnaryOp::logical_not) {
      bool* po = out.data<bool>();
      for (int64_t i = 0; i < n; ++i) po[i] = load(px[i]) == C(0);
      return;
    }
    T* po = out.data<T>();
    dispatch_unary(op, [&](auto op_tag) {
      constexpr UnaryOp kOp = decltype(op_tag)::value;
#pragma omp parallel for if (n > grain::compute) schedule(static)
      for (int64_t i = 0; i < n; ++i) po[i] = store<T>(apply_unary<kOp, C>(load(px[i])));
    });
  });
}

void binary(BinaryOp op, const Array& a, const Array& b, Array& out) {
  BroadcastPlan plan = make_broadcast_plan(out.shape(), {a.shape(), b.shape()});
  const int64_t rows = plan.rows(), len = plan.row_length();
  const int64_t sa = plan.strides[0].back(), sb = plan.strides[1].back();
  dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    auto rows_loop = [&](auto out_tag, auto op_tag) {
      using O = decltype(out_tag);
      constexpr BinaryOp kOp = decltype(op_tag)::value;
      O* po = out.data<O>();
      // One long row (same-shape operands coalesce to one) is split across threads;
      // otherwise rows are.
      auto row = [&](const T* ra, const T* rb, O* ro, int64_t from, int64_t to) {
        if (sa == 1 && sb == 1) {
          for (int64_t i = from; i < to; ++i) ro[i] = store<O>(apply_binary<kOp, C>(load(ra[i]), load(rb[i])));
        } else if (sb == 0) {
          const C bv = load(rb[0]);
          for (int64_t i = from; i < to; ++i) ro[i] = store<O>(apply_binary<kOp, C>(load(ra[i * sa]), bv));
        } else {
          for (int64_t i = from; i < to; ++i)
            ro[i] = store<O>(apply_binary<kOp, C>(load(ra[i * sa]), load(rb[i * sb])));
        }
      };
      if (rows == 1) {
        const int64_t chunk = grain::row;
#pragma omp parallel for if (len > 2 * chunk) schedule(static)
        for (int64_t c = 0; c < (len + chunk - 1) / chunk; ++c)
          row(pa, pb, po, c * chunk, std::min(len, (c + 1) * chunk));
        return;
      }
#pragma omp parallel for if (rows * len > grain::compute) schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        int64_t off[2];
        plan.row_offsets(r, off);
        row(pa + off[0], pb + off[1], po + r * len, 0, len);
      }
    };
    dispatch_binary(op, [&](auto op_tag) {
      if (is_comparison(op)) rows_loop(bool{}, op_tag);
      else rows_loop(T{}, op_tag);
    });
  });
}

void where(const Array& cond, const Array& a, const Array& b, Array& out) {
  BroadcastPlan plan = make_broadcast_plan(out.shape(), {cond.shape(), a.shape(), b.shape()});
  const int64_t rows = plan.rows(), len = plan.row_length();
  const int64_t sc = plan.strides[0].back(), sa = plan.strides[1].back(), sb = plan.strides[2].back();
  const bool* pc = cond.data<bool>();
  dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    // Rows whose operands are contiguous or constant along the row (the usual masks and
    // ReLU/scalar cases) get loops with compile-time strides, which vectorize.
    // Work is split into pieces of at most grain::row elements of one row, so that a single
    // long row (same-shape operands coalesce to one) runs on every thread too.
    const int64_t pieces_per_row = std::max<int64_t>(1, (len + grain::row - 1) / grain::row);
    auto rows_with = [&](auto csa, auto csb) {
      constexpr int64_t ka = decltype(csa)::value, kb = decltype(csb)::value;
#pragma omp parallel for if (rows * len > grain::compute && rows * pieces_per_row > 1) schedule(static)
      for (int64_t piece = 0; piece < rows * pieces_per_row; ++piece) {
        const int64_t r = piece / pieces_per_row, from = (piece % pieces_per_row) * grain::row;
        const int64_t to = std::min(len, from + grain::row);
        int64_t off[3];
        plan.row_offsets(r, off);
        const bool* rc = pc + off[0];
        const T* ra = pa + off[1];
        const T* rb = pb + off[2];
        T* ro = po + r * len;
        if constexpr (ka >= 0 && kb >= 0) {
#pragma omp simd
          for (int64_t i = from; i < to; ++i) ro[i] = rc[i] ? ra[i * ka] : rb[i * kb];
        } else {
          for (int64_t i = from; i < to; ++i) ro[i] = rc[i * sc] ? ra[i * sa] : rb[i * sb];
        }
      }
    };
    using C0 = std::integral_constant<int64_t, 0>;
    using C1 = std::integral_constant<int64_t, 1>;
    using Any = std::integral_constant<int64_t, -1>;
    if (sc == 1 && sa == 1 && sb == 1) rows_with(C1{}, C1{});
    else if (sc == 1 && sa == 1 && sb == 0) rows_with(C1{}, C0{});
    else if (sc == 1 && sa == 0 && sb == 1) rows_with(C0{}, C1{});
    else rows_with(Any{}, Any{});
  });
}

void relu_backward(const Array& x, const Array& g, Array& out) {
  const int64_t n = x.numel();
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error("[relu] no gradient for bool arrays");
    } else {
      const T* px = x.data<T>();
      const T* pg = g.data<T>();
      T* po = out.data<T>();
#pragma omp parallel for if (n > grain::compute) schedule(static)
      for (int64_t i = 0; i < n; ++i) po[i] = load(px[i]) > compute_t<T>(0) ? pg[i] : store<T>(compute_t<T>(0));
    }
  });
}

void gelu_backward(const Array& x, const Array& g, bool approximate, Array& out) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "gelu", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pg = g.data<T>();
    T* po = out.data<T>();
    if (approximate) {
#pragma omp parallel for if (n > grain::compute) schedule(static)
      for (int64_t i = 0; i < n; ++i) po[i] = store_f32<T>(load_f32(pg[i]) * gelu_derivative<true>(load_f32(px[i])));
    } else {
#pragma omp parallel for if (n > grain::compute) schedule(static)
      for (int64_t i = 0; i < n; ++i) po[i] = store_f32<T>(load_f32(pg[i]) * gelu_derivative<false>(load_f32(px[i])));
    }
  });
}

void cast(const Array& x, Array& out) {
  const int64_t n = x.numel();
  dispatch_dtype(x.dtype(), [&](auto in_tag) {
    using I = decltype(in_tag);
    dispatch_dtype(out.dtype(), [&](auto out_tag) {
      using O = decltype(out_tag);
      const I* px = x.data<I>();
      O* po = out.data<O>();
#pragma omp parallel for if (n > grain::copy) schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<I, O>) po[i] = px[i];
        else if constexpr (std::is_same_v<O, bool>) po[i] = to_double(px[i]) != 0.0;
        else if constexpr (std::is_integral_v<O> && !std::is_integral_v<I>) po[i] = O(load_f32(px[i]));  // truncates like torch
        else po[i] = from_double<O>(to_double(px[i]));
      }
    });
  });
}

void bias_activation(UnaryOp act, const Array& y, const Array& bias, Array& out) {
  const int64_t c = y.dim(-1), n = c > 0 ? y.numel() / c : 0;
  with_bias_activation(act, y, bias, [&](auto act_tag, auto yt, const float* b) {
    constexpr UnaryOp a = decltype(act_tag)::value;
    using T = decltype(yt);
    const T* py = y.data<T>();
    T* po = out.data<T>();
#pragma omp parallel for if (n * c > grain::compute && n > 1) schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const T* yr = py + r * c;
      T* orow = po + r * c;
      as_own_loop([&] {
#pragma omp simd
        for (int64_t i = 0; i < c; ++i)
          orow[i] = store_f32<T>(activation_value<a>(round_to_f32<T>(load_f32(yr[i]) + b[i])));
      });
    }
  });
}

void bias_activation_backward(UnaryOp act, const Array& y, const Array& bias, const Array& g, Array& dpre,
                              Array* dbias) {
  const int64_t c = y.dim(-1), n = c > 0 ? y.numel() / c : 0;
  const int64_t chunks = (n + kBiasRowChunk - 1) / kBiasRowChunk;
  std::vector<double> part(dbias ? size_t(chunks * c) : 0);
  with_bias_activation(act, y, bias, [&](auto act_tag, auto yt, const float* b) {
    constexpr UnaryOp a = decltype(act_tag)::value;
    using T = decltype(yt);
    const T* py = y.data<T>();
    const T* pg = g.data<T>();
    T* pd = dpre.data<T>();
#pragma omp parallel for if (n * c > grain::compute && chunks > 1) schedule(static)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      double* acc = dbias ? part.data() + ch * c : nullptr;
      const int64_t r1 = std::min(n, (ch + 1) * kBiasRowChunk);
      for (int64_t r = ch * kBiasRowChunk; r < r1; ++r) {
        const T* yr = py + r * c;
        const T* gr = pg + r * c;
        T* dr = pd + r * c;
        // No simd pragma: vectorized as gelu_backward's loop is, so both round alike.
        for (int64_t i = 0; i < c; ++i) {
          const float pre = round_to_f32<T>(load_f32(yr[i]) + b[i]);
          const float gv = load_f32(gr[i]);
          // ReLU passes g or 0 (as relu_backward: no 0·inf), the GeLUs scale it.
          if constexpr (a == UnaryOp::relu) dr[i] = store_f32<T>(pre > 0.0f ? gv : 0.0f);
          else dr[i] = store_f32<T>(gv * activation_derivative<a>(pre));
        }
        if (acc) {
#pragma omp simd
          for (int64_t i = 0; i < c; ++i) acc[i] += double(load_f32(dr[i]));
        }
      }
    }
  });
  if (!dbias) return;
  dispatch_float(dbias->dtype(), "bias_activation", [&](auto ot) {
    using O = decltype(ot);
    O* po = dbias->data<O>();
    for (int64_t i = 0; i < c; ++i) {
      double s = 0;
      for (int64_t ch = 0; ch < chunks; ++ch) s += part[size_t(ch * c + i)];
      po[i] = store_f32<O>(float(s));
    }
  });
}

}  // namespace mt::cpu
