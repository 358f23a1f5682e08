#pragma once
// The elementwise kernel family: cpu/elementwise.cpp and cuda/elementwise.cu. The op lists,
// their names and dtype rules are backend-neutral (namespace mt::kernels); the entry points
// are declared once, for both backends, by MT_ELEMENTWISE_KERNELS.
#include "meshtrain/core/array.h"

namespace mt::kernels {

// Every unary op once: X(enumerator, op name, accepts integer inputs). The enum, the names,
// the kernel dispatch and the dtype check are all generated from this list.
#define MT_UNARY_OPS(X)                                                                                  \
  X(neg, "neg", true) X(exp, "exp", false) X(log, "log", false) X(sqrt, "sqrt", false)                  \
  X(rsqrt, "rsqrt", false) X(tanh, "tanh", false) X(abs, "abs", true) X(sign, "sign", true)            \
  X(relu, "relu", true) X(sigmoid, "sigmoid", false) X(silu, "silu", false) X(gelu_erf, "gelu", false) \
  X(gelu_tanh, "gelu_tanh", false) X(erf, "erf", false) X(sin, "sin", false) X(cos, "cos", false)      \
  X(square, "square", true) X(reciprocal, "reciprocal", false) X(logical_not, "logical_not", true)
// Every binary op once: X(enumerator, op name). Comparisons (eq and after) return bool.
#define MT_BINARY_OPS(X)                                                                               \
  X(add, "add") X(sub, "sub") X(mul, "mul") X(div, "div") X(pow, "pow") X(maximum, "maximum")         \
  X(minimum, "minimum") X(eq, "eq") X(ne, "ne") X(lt, "lt") X(le, "le") X(gt, "gt") X(ge, "ge")       \
  X(logical_and, "logical_and") X(logical_or, "logical_or")

#define MT_ENUMERATOR(e, ...) e,
enum class UnaryOp { MT_UNARY_OPS(MT_ENUMERATOR) };
enum class BinaryOp { MT_BINARY_OPS(MT_ENUMERATOR) };
#undef MT_ENUMERATOR

const char* unary_name(UnaryOp op);
const char* binary_name(BinaryOp op);
bool unary_accepts_integers(UnaryOp op);
bool is_comparison(BinaryOp op);  // eq, ne, lt, le, gt, ge, logical_and, logical_or: bool results

}  // namespace mt::kernels

// unary:   out = op(x); out: same shape, same dtype (bool for logical_not).
// binary:  out = op(a, b) with NumPy broadcasting; out has the broadcast shape.
// where:   out = cond ? a : b, all three broadcast to out's shape.
// relu_backward: out = x > 0 ? g : 0 (ReLU's first-order VJP in one pass); all one shape and dtype.
// gelu_backward: out = g · gelu'(x) (erf form, or the tanh form when approximate); all one shape.
// cast:    out = x converted to out's dtype (same shape).
// bias_activation: out = act(pre), pre = y + bias rounded to y's dtype (as the composed add
//   rounds it), bias (C,) along y's last dim in any float dtype; act is relu, gelu (erf) or
//   gelu_tanh. The linear layer's epilogue in one pass.
// bias_activation_backward: dpre = g · act'(pre) (y's dtype, rounded as the composed VJP),
//   and when dbias is non-null dbias (C,) = the column sums of dpre in bias's dtype, summed in
//   f64 per 64-row chunk and then over chunks in order (deterministic for any thread count).
#define MT_ELEMENTWISE_KERNELS                                                                         \
  void unary(kernels::UnaryOp op, const Array& x, Array& out);                                         \
  void binary(kernels::BinaryOp op, const Array& a, const Array& b, Array& out);                       \
  void where(const Array& cond, const Array& a, const Array& b, Array& out);                           \
  void relu_backward(const Array& x, const Array& g, Array& out);                                      \
  void gelu_backward(const Array& x, const Array& g, bool approximate, Array& out);                    \
  void cast(const Array& x, Array& out);                                                               \
  void bias_activation(kernels::UnaryOp act, const Array& y, const Array& bias, Array& out);            \
  void bias_activation_backward(kernels::UnaryOp act, const Array& y, const Array& bias, const Array& g, \
                                Array& dpre, Array* dbias);

namespace mt::cpu { MT_ELEMENTWISE_KERNELS }
namespace mt::cuda { MT_ELEMENTWISE_KERNELS }
