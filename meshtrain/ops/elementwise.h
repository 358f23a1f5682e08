#pragma once
#include "meshtrain/core/array.h"

namespace mt {

// Binary ops broadcast like NumPy; both operands must share a dtype (a double operand
// takes the array's dtype).
Array add(const Array& a, const Array& b);
// add(a, b), written into a's storage when `a` was moved in as its storage's sole owner
// (Array::sole_owner), b is untraced and the result has a's shape and dtype; otherwise into
// a new array. For loops that replace a value by its update: x = add_in_place(std::move(x), u).
Array add_in_place(Array a, const Array& b);
// mul(a, b), in a's storage under the same conditions (gradient clipping scales in place).
Array mul_in_place(Array a, const Array& b);
Array sub(const Array& a, const Array& b);
Array mul(const Array& a, const Array& b);
Array div(const Array& a, const Array& b);
Array pow(const Array& a, const Array& b);
Array pow(const Array& a, double exponent);
Array maximum(const Array& a, const Array& b);
Array minimum(const Array& a, const Array& b);

// Comparisons return bool arrays and have no gradient.
Array eq(const Array& a, const Array& b);
Array ne(const Array& a, const Array& b);
Array lt(const Array& a, const Array& b);
Array le(const Array& a, const Array& b);
Array gt(const Array& a, const Array& b);
Array ge(const Array& a, const Array& b);
Array logical_and(const Array& a, const Array& b);
Array logical_or(const Array& a, const Array& b);
Array logical_not(const Array& a);

Array neg(const Array& x);
Array exp(const Array& x);
Array log(const Array& x);
Array sqrt(const Array& x);
Array rsqrt(const Array& x);
Array tanh(const Array& x);
Array abs(const Array& x);
Array sign(const Array& x);
Array square(const Array& x);
Array reciprocal(const Array& x);
Array erf(const Array& x);
Array sin(const Array& x);
Array cos(const Array& x);
Array sigmoid(const Array& x);
Array relu(const Array& x);
Array silu(const Array& x);
// approximate=false: x·Φ(x) with erf (BERT); true: the tanh form (GPT-2's gelu_new).
Array gelu(const Array& x, bool approximate = false);
// GeLU's VJP, g · gelu'(x): one fused pass when the backward is not recorded, else written
// with ops (so it is differentiated again: second-order gradients).
Array gelu_vjp(const Array& x, const Array& g, bool approximate);

// cond ? a : b with broadcasting; cond must be bool.
Array where(const Array& cond, const Array& a, const Array& b);
Array cast(const Array& x, DType dtype);
// x_cast (which must equal cast(x, x_cast.dtype())) as a differentiable function of x: the
// cast made once and reused, with cast's gradient (mixed precision's parameter copies).
Array precast(const Array& x, const Array& x_cast);

// Scalar conveniences: the scalar takes the array's dtype.
Array add(const Array& a, double b);
Array sub(const Array& a, double b);
Array mul(const Array& a, double b);
Array div(const Array& a, double b);
// A 0-d array of `value` in a's dtype, for broadcasting against a.
Array scalar_like(const Array& a, double value);
Array zeros_like(const Array& a);
Array ones_like(const Array& a);

inline Array operator+(const Array& a, const Array& b) { return add(a, b); }
inline Array operator-(const Array& a, const Array& b) { return sub(a, b); }
inline Array operator*(const Array& a, const Array& b) { return mul(a, b); }
inline Array operator/(const Array& a, const Array& b) { return div(a, b); }
inline Array operator-(const Array& a) { return neg(a); }
inline Array operator+(const Array& a, double b) { return add(a, b); }
inline Array operator-(const Array& a, double b) { return sub(a, b); }
inline Array operator*(const Array& a, double b) { return mul(a, b); }
inline Array operator/(const Array& a, double b) { return div(a, b); }
inline Array operator+(double a, const Array& b) { return add(b, a); }
inline Array operator*(double a, const Array& b) { return mul(b, a); }
inline Array operator-(double a, const Array& b) { return add(neg(b), a); }
inline Array operator/(double a, const Array& b) { return mul(reciprocal(b), a); }

}  // namespace mt
