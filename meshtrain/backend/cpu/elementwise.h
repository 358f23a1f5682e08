#pragma once
#include "meshtrain/core/array.h"

namespace mt::cpu {

enum class UnaryOp { neg, exp, log, sqrt, rsqrt, tanh, abs, sign, relu, sigmoid, silu, gelu_erf, gelu_tanh, erf, sin, cos, square, reciprocal, logical_not };
enum class BinaryOp { add, sub, mul, div, pow, maximum, minimum, eq, ne, lt, le, gt, ge, logical_and, logical_or };

const char* unary_name(UnaryOp op);
const char* binary_name(BinaryOp op);
bool is_comparison(BinaryOp op);

// out = op(x); out: same shape, same dtype (bool for logical_not).
void unary(UnaryOp op, const Array& x, Array& out);
// out = op(a, b) with NumPy broadcasting; out has the broadcast shape.
void binary(BinaryOp op, const Array& a, const Array& b, Array& out);
// out = cond ? a : b, all three broadcast to out's shape.
void where(const Array& cond, const Array& a, const Array& b, Array& out);
// out = g · gelu'(x) (erf form, or the tanh form when approximate); all the same shape.
void gelu_backward(const Array& x, const Array& g, bool approximate, Array& out);
// out = x converted to out's dtype (same shape).
void cast(const Array& x, Array& out);

}  // namespace mt::cpu
