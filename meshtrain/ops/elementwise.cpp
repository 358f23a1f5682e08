#include "meshtrain/ops/elementwise.h"

#include <cmath>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/cpu/elementwise.h"
#include "meshtrain/core/error.h"
#include "meshtrain/dist/rules.h"
#include "meshtrain/dist/spmd.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt {

using autodiff::record;
using cpu::BinaryOp;
using cpu::UnaryOp;
using Grads = std::vector<Array>;

namespace {

void check_defined(const Array& a, const char* op) { MT_CHECK(a.defined(), "[", op, "] undefined input array"); }

Array binary_forward(BinaryOp op, const Array& a, const Array& b) {
  const char* name = cpu::binary_name(op);
  check_defined(a, name);
  check_defined(b, name);
  MT_CHECK(a.dtype() == b.dtype(), "[", name, "] dtype mismatch: ", a.str(), " vs ", b.str(),
           " (cast one operand first)");
  bool logical = op == BinaryOp::logical_and || op == BinaryOp::logical_or;
  MT_CHECK(logical || cpu::is_comparison(op) || a.dtype() != DType::boolean, "[", name,
           "] arithmetic on bool arrays ", a.str(), ", ", b.str());
  MT_CHECK(!(op == BinaryOp::div || op == BinaryOp::pow) || is_floating(a.dtype()), "[", name,
           "] expects floating arrays, got ", a.str(), ", ", b.str());
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Array out = Array::empty(shape, cpu::is_comparison(op) ? DType::boolean : a.dtype());
  cpu::binary(op, a, b, out);
  return out;
}

Array unary_forward(UnaryOp op, const Array& x) {
  const char* name = cpu::unary_name(op);
  check_defined(x, name);
  bool integer_ok = op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::sign || op == UnaryOp::relu ||
                    op == UnaryOp::square || op == UnaryOp::logical_not;
  MT_CHECK(integer_ok || is_floating(x.dtype()), "[", name, "] expects a floating array, got ", x.str());
  Array out = Array::empty(x.shape(), op == UnaryOp::logical_not ? DType::boolean : x.dtype());
  cpu::unary(op, x, out);
  return out;
}

// The op's output for use inside its VJP: the saved value in a first-order pass, but
// recomputed (with history) when the backward pass is itself differentiated.
template <class Recompute>
Array saved_output(const Array& detached_out, Recompute&& recompute) {
  return autodiff::grad_enabled() ? recompute() : detached_out;
}

bool differentiable(const Array& a) { return is_floating(a.dtype()); }

}  // namespace

Array add(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("add", {a, b}, dist::rules::elementwise(dist::rules::Linearity::additive), [](const std::vector<Array>& l) { return add(l[0], l[1]); });
  Array out = binary_forward(BinaryOp::add, a, b);
  if (differentiable(out))
    record(out, "add", {a, b}, [sa = a.shape(), sb = b.shape()](const Array& g) {
      return Grads{sum_to(g, sa), sum_to(g, sb)};
    });
  return out;
}

Array sub(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("sub", {a, b}, dist::rules::elementwise(dist::rules::Linearity::additive), [](const std::vector<Array>& l) { return sub(l[0], l[1]); });
  Array out = binary_forward(BinaryOp::sub, a, b);
  if (differentiable(out))
    record(out, "sub", {a, b}, [sa = a.shape(), sb = b.shape()](const Array& g) {
      return Grads{sum_to(g, sa), sum_to(neg(g), sb)};
    });
  return out;
}

Array mul(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("mul", {a, b}, dist::rules::elementwise(dist::rules::Linearity::scaling), [](const std::vector<Array>& l) { return mul(l[0], l[1]); });
  Array out = binary_forward(BinaryOp::mul, a, b);
  if (differentiable(out))
    record(out, "mul", {a, b}, [a, b](const Array& g) {
      return Grads{a.traced() ? sum_to(mul(g, b), a.shape()) : Array(),
                   b.traced() ? sum_to(mul(g, a), b.shape()) : Array()};
    });
  return out;
}

Array div(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("div", {a, b}, dist::rules::elementwise(dist::rules::Linearity::scaling, true), [](const std::vector<Array>& l) { return div(l[0], l[1]); });
  Array out = binary_forward(BinaryOp::div, a, b);
  record(out, "div", {a, b}, [a, b](const Array& g) {
    Array ga = a.traced() ? sum_to(div(g, b), a.shape()) : Array();
    Array gb = b.traced() ? sum_to(neg(div(mul(g, a), mul(b, b))), b.shape()) : Array();
    return Grads{ga, gb};
  });
  return out;
}

Array pow(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("pow", {a, b}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return pow(l[0], l[1]); });
  Array out = binary_forward(BinaryOp::pow, a, b);
  record(out, "pow", {a, b}, [a, b, o = out.detach()](const Array& g) {
    Array ga, gb;
    if (a.traced()) ga = sum_to(mul(g, mul(b, pow(a, sub(b, 1.0)))), a.shape());
    if (b.traced()) {
      // d/db a^b = a^b log a, defined as 0 where a == 0 and b >= 0 (as PyTorch does).
      Array y = saved_output(o, [&] { return pow(a, b); });
      Array term = mul(y, log(a));
      Array zero_mask = logical_and(eq(a, zeros_like(a)), ge(b, zeros_like(b)));
      gb = sum_to(mul(g, where(zero_mask, zeros_like(term), term)), b.shape());
    }
    return Grads{ga, gb};
  });
  return out;
}

Array pow(const Array& a, double exponent) { return pow(a, scalar_like(a, exponent)); }

Array maximum(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("maximum", {a, b}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return maximum(l[0], l[1]); });
  Array out = binary_forward(BinaryOp::maximum, a, b);
  if (differentiable(out))
    record(out, "maximum", {a, b}, [a, b](const Array& g) {
      // Ties split the gradient evenly, as torch.maximum does.
      Array half = mul(g, 0.5);
      Array tie = eq(a, b);
      Array ga = where(tie, half, where(gt(a, b), g, zeros_like(g)));
      Array gb = where(tie, half, where(lt(a, b), g, zeros_like(g)));
      return Grads{sum_to(ga, a.shape()), sum_to(gb, b.shape())};
    });
  return out;
}

Array minimum(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("minimum", {a, b}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return minimum(l[0], l[1]); });
  Array out = binary_forward(BinaryOp::minimum, a, b);
  if (differentiable(out))
    record(out, "minimum", {a, b}, [a, b](const Array& g) {
      Array half = mul(g, 0.5);
      Array tie = eq(a, b);
      Array ga = where(tie, half, where(lt(a, b), g, zeros_like(g)));
      Array gb = where(tie, half, where(gt(a, b), g, zeros_like(g)));
      return Grads{sum_to(ga, a.shape()), sum_to(gb, b.shape())};
    });
  return out;
}

Array eq(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("eq", {a, b}, dist::rules::elementwise(dist::rules::Linearity::none),
                           [](const std::vector<Array>& l) { return eq(l[0], l[1]); });
  return binary_forward(BinaryOp::eq, a, b);
}
Array ne(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("ne", {a, b}, dist::rules::elementwise(dist::rules::Linearity::none),
                           [](const std::vector<Array>& l) { return ne(l[0], l[1]); });
  return binary_forward(BinaryOp::ne, a, b);
}
Array lt(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("lt", {a, b}, dist::rules::elementwise(dist::rules::Linearity::none),
                           [](const std::vector<Array>& l) { return lt(l[0], l[1]); });
  return binary_forward(BinaryOp::lt, a, b);
}
Array le(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("le", {a, b}, dist::rules::elementwise(dist::rules::Linearity::none),
                           [](const std::vector<Array>& l) { return le(l[0], l[1]); });
  return binary_forward(BinaryOp::le, a, b);
}
Array gt(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("gt", {a, b}, dist::rules::elementwise(dist::rules::Linearity::none),
                           [](const std::vector<Array>& l) { return gt(l[0], l[1]); });
  return binary_forward(BinaryOp::gt, a, b);
}
Array ge(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("ge", {a, b}, dist::rules::elementwise(dist::rules::Linearity::none),
                           [](const std::vector<Array>& l) { return ge(l[0], l[1]); });
  return binary_forward(BinaryOp::ge, a, b);
}
Array logical_and(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("logical_and", {a, b}, dist::rules::elementwise(dist::rules::Linearity::none),
                           [](const std::vector<Array>& l) { return logical_and(l[0], l[1]); });
  return binary_forward(BinaryOp::logical_and, a, b);
}
Array logical_or(const Array& a, const Array& b) {
  if (dist::any_sharded({a, b}))
    return dist::spmd_call("logical_or", {a, b}, dist::rules::elementwise(dist::rules::Linearity::none),
                           [](const std::vector<Array>& l) { return logical_or(l[0], l[1]); });
  return binary_forward(BinaryOp::logical_or, a, b);
}
Array logical_not(const Array& a) {
  if (dist::is_sharded(a))
    return dist::spmd_call("logical_not", {a}, dist::rules::elementwise(dist::rules::Linearity::none),
                           [](const std::vector<Array>& l) { return logical_not(l[0]); });
  return unary_forward(UnaryOp::logical_not, a);
}

Array neg(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("neg", {x}, dist::rules::elementwise(dist::rules::Linearity::scaling), [](const std::vector<Array>& l) { return neg(l[0]); });
  Array out = unary_forward(UnaryOp::neg, x);
  if (differentiable(out)) record(out, "neg", {x}, [](const Array& g) { return Grads{neg(g)}; });
  return out;
}

Array exp(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("exp", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return exp(l[0]); });
  Array out = unary_forward(UnaryOp::exp, x);
  record(out, "exp", {x}, [x, o = out.detach()](const Array& g) {
    return Grads{mul(g, saved_output(o, [&] { return exp(x); }))};
  });
  return out;
}

Array log(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("log", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return log(l[0]); });
  Array out = unary_forward(UnaryOp::log, x);
  record(out, "log", {x}, [x](const Array& g) { return Grads{div(g, x)}; });
  return out;
}

Array sqrt(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("sqrt", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return sqrt(l[0]); });
  Array out = unary_forward(UnaryOp::sqrt, x);
  record(out, "sqrt", {x}, [x, o = out.detach()](const Array& g) {
    return Grads{div(g, mul(saved_output(o, [&] { return sqrt(x); }), 2.0))};
  });
  return out;
}

Array rsqrt(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("rsqrt", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return rsqrt(l[0]); });
  Array out = unary_forward(UnaryOp::rsqrt, x);
  record(out, "rsqrt", {x}, [x, o = out.detach()](const Array& g) {
    Array y = saved_output(o, [&] { return rsqrt(x); });
    return Grads{mul(mul(g, mul(y, mul(y, y))), -0.5)};
  });
  return out;
}

Array tanh(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("tanh", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return tanh(l[0]); });
  Array out = unary_forward(UnaryOp::tanh, x);
  record(out, "tanh", {x}, [x, o = out.detach()](const Array& g) {
    Array y = saved_output(o, [&] { return tanh(x); });
    return Grads{mul(g, sub(ones_like(y), mul(y, y)))};
  });
  return out;
}

Array abs(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("abs", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return abs(l[0]); });
  Array out = unary_forward(UnaryOp::abs, x);
  if (differentiable(out)) record(out, "abs", {x}, [x](const Array& g) { return Grads{mul(g, sign(x))}; });
  return out;
}

Array sign(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("sign", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return sign(l[0]); });
  Array out = unary_forward(UnaryOp::sign, x);
  if (differentiable(out)) record(out, "sign", {x}, [](const Array& g) { return Grads{zeros_like(g)}; });
  return out;
}

Array square(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("square", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return square(l[0]); });
  Array out = unary_forward(UnaryOp::square, x);
  if (differentiable(out)) record(out, "square", {x}, [x](const Array& g) { return Grads{mul(g, mul(x, 2.0))}; });
  return out;
}

Array reciprocal(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("reciprocal", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return reciprocal(l[0]); });
  Array out = unary_forward(UnaryOp::reciprocal, x);
  record(out, "reciprocal", {x}, [x, o = out.detach()](const Array& g) {
    Array y = saved_output(o, [&] { return reciprocal(x); });
    return Grads{neg(mul(g, mul(y, y)))};
  });
  return out;
}

Array erf(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("erf", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return erf(l[0]); });
  Array out = unary_forward(UnaryOp::erf, x);
  record(out, "erf", {x}, [x](const Array& g) {
    return Grads{mul(g, mul(exp(neg(mul(x, x))), 2.0 / std::sqrt(M_PI)))};
  });
  return out;
}

Array sin(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("sin", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return sin(l[0]); });
  Array out = unary_forward(UnaryOp::sin, x);
  record(out, "sin", {x}, [x](const Array& g) { return Grads{mul(g, cos(x))}; });
  return out;
}

Array cos(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("cos", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return cos(l[0]); });
  Array out = unary_forward(UnaryOp::cos, x);
  record(out, "cos", {x}, [x](const Array& g) { return Grads{neg(mul(g, sin(x)))}; });
  return out;
}

Array sigmoid(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("sigmoid", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return sigmoid(l[0]); });
  Array out = unary_forward(UnaryOp::sigmoid, x);
  record(out, "sigmoid", {x}, [x, o = out.detach()](const Array& g) {
    Array y = saved_output(o, [&] { return sigmoid(x); });
    return Grads{mul(g, mul(y, sub(ones_like(y), y)))};
  });
  return out;
}

Array relu(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("relu", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return relu(l[0]); });
  Array out = unary_forward(UnaryOp::relu, x);
  if (differentiable(out))
    record(out, "relu", {x}, [x](const Array& g) { return Grads{where(gt(x, zeros_like(x)), g, zeros_like(g))}; });
  return out;
}

Array silu(const Array& x) {
  if (dist::is_sharded(x))
    return dist::spmd_call("silu", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return silu(l[0]); });
  Array out = unary_forward(UnaryOp::silu, x);
  record(out, "silu", {x}, [x](const Array& g) {
    Array s = sigmoid(x);
    // d/dx x·σ(x) = σ(x)·(1 + x·(1 − σ(x)))
    return Grads{mul(g, mul(s, add(mul(x, sub(ones_like(s), s)), 1.0)))};
  });
  return out;
}

Array gelu(const Array& x, bool approximate) {
  if (dist::is_sharded(x))
    return dist::spmd_call("gelu", {x}, dist::rules::elementwise(dist::rules::Linearity::none), [approximate](const std::vector<Array>& l) { return gelu(l[0], approximate); });
  Array out = unary_forward(approximate ? UnaryOp::gelu_tanh : UnaryOp::gelu_erf, x);
  record(out, "gelu", {x}, [x, approximate](const Array& g) {
    if (!autodiff::grad_enabled()) {
      // First order: one fused pass. A recorded backward (second order) composes ops.
      MT_CHECK(g.shape() == x.shape() && g.dtype() == x.dtype(), "[gelu] cotangent ", g.str(), " for input ", x.str());
      Array dx = Array::empty(x.shape(), x.dtype());
      cpu::gelu_backward(x, g, approximate, dx);
      return Grads{dx};
    }
    if (!approximate) {
      // Φ(x) + x·φ(x)
      Array cdf = mul(add(erf(mul(x, M_SQRT1_2)), 1.0), 0.5);
      Array pdf = mul(exp(mul(mul(x, x), -0.5)), 1.0 / std::sqrt(2.0 * M_PI));
      return Grads{mul(g, add(cdf, mul(x, pdf)))};
    }
    const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
    Array x2 = mul(x, x);
    Array t = tanh(mul(mul(x, add(mul(x2, c), 1.0)), k));
    Array left = mul(add(t, 1.0), 0.5);
    Array dt = mul(sub(ones_like(t), mul(t, t)), mul(add(mul(x2, 3.0 * c), 1.0), k));
    return Grads{mul(g, add(left, mul(mul(x, dt), 0.5)))};
  });
  return out;
}

Array where(const Array& cond, const Array& a, const Array& b) {
  if (dist::any_sharded({cond, a, b}))
    return dist::spmd_call("where", {cond, a, b}, dist::rules::elementwise(dist::rules::Linearity::none), [](const std::vector<Array>& l) { return where(l[0], l[1], l[2]); });
  check_defined(cond, "where");
  check_defined(a, "where");
  check_defined(b, "where");
  MT_CHECK(cond.dtype() == DType::boolean, "[where] condition must be bool, got ", cond.str());
  MT_CHECK(a.dtype() == b.dtype(), "[where] dtype mismatch: ", a.str(), " vs ", b.str());
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Array out = Array::empty(shape, a.dtype());
  cpu::where(cond, a, b, out);
  if (differentiable(out))
    record(out, "where", {cond, a, b}, [cond, sa = a.shape(), sb = b.shape()](const Array& g) {
      Array z = zeros_like(g);
      return Grads{Array(), sum_to(where(cond, g, z), sa), sum_to(where(cond, z, g), sb)};
    });
  return out;
}

Array cast(const Array& x, DType dtype) {
  if (dist::is_sharded(x))
    return dist::spmd_call("cast", {x}, dist::rules::elementwise(dist::rules::Linearity::scaling), [dtype](const std::vector<Array>& l) { return cast(l[0], dtype); });
  check_defined(x, "cast");
  if (x.dtype() == dtype) return x;
  Array out = Array::empty(x.shape(), dtype);
  cpu::cast(x, out);
  if (is_floating(dtype) && is_floating(x.dtype()))
    record(out, "cast", {x}, [from = x.dtype()](const Array& g) { return Grads{cast(g, from)}; });
  return out;
}

Array scalar_like(const Array& a, double value) { return Array::full(Shape{}, value, a.dtype()); }
Array zeros_like(const Array& a) {
  if (dist::is_sharded(a)) return dist::full_like(a, 0.0);
  return Array::zeros(a.shape(), a.dtype());
}
Array ones_like(const Array& a) {
  if (dist::is_sharded(a)) return dist::full_like(a, 1.0);
  return Array::ones(a.shape(), a.dtype());
}
Array add(const Array& a, double b) { return add(a, scalar_like(a, b)); }
Array sub(const Array& a, double b) { return sub(a, scalar_like(a, b)); }
Array mul(const Array& a, double b) { return mul(a, scalar_like(a, b)); }
Array div(const Array& a, double b) { return div(a, scalar_like(a, b)); }

}  // namespace mt
