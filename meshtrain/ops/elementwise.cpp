// Elementwise primitives: unary and binary ops (one primitive type each, parameterized by
// the op from the backend's op lists), where, cast, and the layout-preserving fill behind
// zeros_like / ones_like.
#include "meshtrain/ops/elementwise.h"

#include <cmath>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/elementwise.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

using kernels::BinaryOp;
using kernels::UnaryOp;
using layout::rules::Linearity;
using prim::OutputInfo;
using prim::Saved;
using Grads = std::vector<Array>;
using Inputs = std::vector<Array>;

namespace {

void check_defined(const Array& a, const char* op) { MT_CHECK(a.defined(), "[", op, "] undefined input array"); }

class UnaryPrimitive final : public prim::Primitive {
 public:
  explicit UnaryPrimitive(UnaryOp op) : op_(op) {}
  const char* name() const override { return kernels::unary_name(op_); }

  OutputInfo infer(const Inputs& in) const override {
    const Array& x = in[0];
    check_defined(x, name());
    MT_CHECK(kernels::unary_accepts_integers(op_) || is_floating(x.dtype()), "[", name(),
             "] expects a floating array, got ", x.str());
    return {x.shape(), op_ == UnaryOp::logical_not ? DType::boolean : x.dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, unary, op_, in[0], out);
    return out;
  }

  uint32_t keeps_inputs() const override { return op_ == UnaryOp::neg || op_ == UnaryOp::sign ? 0u : 1u; }
  bool keeps_output() const override {
    switch (op_) {
      case UnaryOp::exp: case UnaryOp::sqrt: case UnaryOp::rsqrt: case UnaryOp::tanh:
      case UnaryOp::reciprocal: case UnaryOp::sigmoid: return true;
      default: return false;
    }
  }
  Grads vjp(const Saved& s, const Array& g) const override;

  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape& mesh) const override {
    return layout::rules::elementwise(in, mesh, op_ == UnaryOp::neg ? Linearity::scaling : Linearity::none);
  }

 private:
  UnaryOp op_;
};

Grads UnaryPrimitive::vjp(const Saved& s, const Array& g) const {
  const Array& x = s.inputs[0];
  switch (op_) {
    case UnaryOp::neg: return {neg(g)};
    case UnaryOp::exp: return {mul(g, s.output_for_vjp())};
    case UnaryOp::log: return {div(g, x)};
    case UnaryOp::sqrt: return {div(g, mul(s.output_for_vjp(), 2.0))};
    case UnaryOp::rsqrt: {
      Array y = s.output_for_vjp();
      return {mul(mul(g, mul(y, mul(y, y))), -0.5)};
    }
    case UnaryOp::tanh: {
      Array y = s.output_for_vjp();
      return {mul(g, sub(ones_like(y), mul(y, y)))};
    }
    case UnaryOp::abs: return {mul(g, sign(x))};
    case UnaryOp::sign: return {zeros_like(g)};
    case UnaryOp::square: return {mul(g, mul(x, 2.0))};
    case UnaryOp::reciprocal: {
      Array y = s.output_for_vjp();
      return {neg(mul(g, mul(y, y)))};
    }
    case UnaryOp::erf: return {mul(g, mul(exp(neg(mul(x, x))), 2.0 / std::sqrt(M_PI)))};
    case UnaryOp::sin: return {mul(g, cos(x))};
    case UnaryOp::cos: return {neg(mul(g, sin(x)))};
    case UnaryOp::sigmoid: {
      Array y = s.output_for_vjp();
      return {mul(g, mul(y, sub(ones_like(y), y)))};
    }
    case UnaryOp::relu:
      if (!autodiff::grad_enabled() && g.shape() == x.shape() && g.dtype() == x.dtype()) {
        // First order: one fused pass. A recorded backward (second order) composes ops.
        Array dx = Array::empty(x.shape(), x.dtype(), x.device());
        MT_KERNEL(dx, relu_backward, x, g, dx);
        return {dx};
      }
      return {where(gt(x, zeros_like(x)), g, zeros_like(g))};
    case UnaryOp::silu: {
      // d/dx x·σ(x) = σ(x)·(1 + x·(1 − σ(x)))
      Array sg = sigmoid(x);
      return {mul(g, mul(sg, add(mul(x, sub(ones_like(sg), sg)), 1.0)))};
    }
    case UnaryOp::gelu_erf:
    case UnaryOp::gelu_tanh: return {gelu_vjp(x, g, op_ == UnaryOp::gelu_tanh)};
    case UnaryOp::logical_not: break;
  }
  return prim::Primitive::vjp(s, g);
}

class BinaryPrimitive final : public prim::Primitive {
 public:
  explicit BinaryPrimitive(BinaryOp op) : op_(op) {}
  const char* name() const override { return kernels::binary_name(op_); }

  OutputInfo infer(const Inputs& in) const override {
    const Array &a = in[0], &b = in[1];
    check_defined(a, name());
    check_defined(b, name());
    MT_CHECK(a.dtype() == b.dtype(), "[", name(), "] dtype mismatch: ", a.str(), " vs ", b.str(),
             " (cast one operand first)");
    const bool logical = op_ == BinaryOp::logical_and || op_ == BinaryOp::logical_or;
    MT_CHECK(logical || kernels::is_comparison(op_) || a.dtype() != DType::boolean, "[", name(),
             "] arithmetic on bool arrays ", a.str(), ", ", b.str());
    MT_CHECK(!(op_ == BinaryOp::div || op_ == BinaryOp::pow) || is_floating(a.dtype()), "[", name(),
             "] expects floating arrays, got ", a.str(), ", ", b.str());
    return {broadcast_shapes(a.shape(), b.shape(), name()), kernels::is_comparison(op_) ? DType::boolean : a.dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    // The kernels read a[i] before writing out[i], so out may be a itself when nobody else
    // can see a (only a caller that moved it in can get here with a sole owner).
    const bool reuse = in[0].sole_owner() && !in[1].traced() && in[0].shape() == o.shape && in[0].dtype() == o.dtype;
    Array out = reuse ? in[0] : Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, binary, op_, in[0], in[1], out);
    return out;
  }

  uint32_t keeps_inputs() const override { return op_ == BinaryOp::add || op_ == BinaryOp::sub ? 0u : 3u; }
  bool keeps_output() const override { return op_ == BinaryOp::pow; }
  Grads vjp(const Saved& s, const Array& g) const override;

  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape& mesh) const override {
    switch (op_) {
      case BinaryOp::add:
      case BinaryOp::sub: return layout::rules::elementwise(in, mesh, Linearity::additive);
      case BinaryOp::mul: return layout::rules::elementwise(in, mesh, Linearity::scaling);
      case BinaryOp::div: return layout::rules::elementwise(in, mesh, Linearity::scaling, true);
      default: return layout::rules::elementwise(in, mesh, Linearity::none);
    }
  }

 private:
  BinaryOp op_;
};

Grads BinaryPrimitive::vjp(const Saved& s, const Array& g) const {
  const Array &a = s.inputs[0], &b = s.inputs[1];
  const Shape &sa = s.shapes[0], &sb = s.shapes[1];
  Grads out(2);
  switch (op_) {
    case BinaryOp::add:
      if (s.wants(0)) out[0] = sum_to(g, sa);
      if (s.wants(1)) out[1] = sum_to(g, sb);
      return out;
    case BinaryOp::sub:
      if (s.wants(0)) out[0] = sum_to(g, sa);
      if (s.wants(1)) out[1] = sum_to(neg(g), sb);
      return out;
    case BinaryOp::mul:
      if (s.wants(0)) out[0] = sum_to(mul(g, b), sa);
      if (s.wants(1)) out[1] = sum_to(mul(g, a), sb);
      return out;
    case BinaryOp::div:
      if (s.wants(0)) out[0] = sum_to(div(g, b), sa);
      if (s.wants(1)) out[1] = sum_to(neg(div(mul(g, a), mul(b, b))), sb);
      return out;
    case BinaryOp::pow:
      if (s.wants(0)) out[0] = sum_to(mul(g, mul(b, pow(a, sub(b, 1.0)))), sa);
      if (s.wants(1)) {
        // d/db a^b = a^b log a, defined as 0 where a == 0 and b >= 0 (as PyTorch does).
        Array term = mul(s.output_for_vjp(), log(a));
        Array zero_mask = logical_and(eq(a, zeros_like(a)), ge(b, zeros_like(b)));
        out[1] = sum_to(mul(g, where(zero_mask, zeros_like(term), term)), sb);
      }
      return out;
    case BinaryOp::maximum:
    case BinaryOp::minimum: {
      // Ties split the gradient evenly, as torch.maximum / torch.minimum do.
      Array half = mul(g, 0.5);
      Array tie = eq(a, b);
      Array a_wins = op_ == BinaryOp::maximum ? gt(a, b) : lt(a, b);
      Array b_wins = op_ == BinaryOp::maximum ? lt(a, b) : gt(a, b);
      if (s.wants(0)) out[0] = sum_to(where(tie, half, where(a_wins, g, zeros_like(g))), sa);
      if (s.wants(1)) out[1] = sum_to(where(tie, half, where(b_wins, g, zeros_like(g))), sb);
      return out;
    }
    default: break;
  }
  return prim::Primitive::vjp(s, g);
}

class WherePrimitive final : public prim::Primitive {
 public:
  const char* name() const override { return "where"; }
  OutputInfo infer(const Inputs& in) const override {
    const Array &cond = in[0], &a = in[1], &b = in[2];
    check_defined(cond, "where");
    check_defined(a, "where");
    check_defined(b, "where");
    MT_CHECK(cond.dtype() == DType::boolean, "[where] condition must be bool, got ", cond.str());
    MT_CHECK(a.dtype() == b.dtype(), "[where] dtype mismatch: ", a.str(), " vs ", b.str());
    return {broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where"), a.dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, where, in[0], in[1], in[2], out);
    return out;
  }
  uint32_t keeps_inputs() const override { return 1u; }  // the condition
  Grads vjp(const Saved& s, const Array& g) const override {
    Array z = zeros_like(g);
    Grads out(3);
    if (s.wants(1)) out[1] = sum_to(where(s.inputs[0], g, z), s.shapes[1]);
    if (s.wants(2)) out[2] = sum_to(where(s.inputs[0], z, g), s.shapes[2]);
    return out;
  }
  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape& mesh) const override {
    return layout::rules::elementwise(in, mesh, Linearity::none);
  }
};

class CastPrimitive final : public prim::Primitive {
 public:
  explicit CastPrimitive(DType to) : to_(to) {}
  const char* name() const override { return "cast"; }
  OutputInfo infer(const Inputs& in) const override {
    check_defined(in[0], "cast");
    return {in[0].shape(), to_};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, cast, in[0], out);
    return out;
  }
  bool differentiable(const Inputs& in, const OutputInfo& o) const override {
    return is_floating(o.dtype) && is_floating(in[0].dtype());
  }
  uint32_t keeps_inputs() const override { return 0; }
  Grads vjp(const Saved& s, const Array& g) const override { return {cast(g, s.dtypes[0])}; }
  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape& mesh) const override {
    return layout::rules::elementwise(in, mesh, Linearity::scaling);
  }

 private:
  DType to_;
};

// x cast to the dtype of x_cast, which already holds that cast (made once, reused by every
// use): the output is x_cast itself, and the VJP casts the cotangent back to x's dtype, as
// cast's does. Mixed precision casts the f32 master weights to bf16 once per step and hands
// every gradient-accumulation micro-step this op, so no micro-step casts again.
class PrecastPrimitive final : public prim::Primitive {
 public:
  const char* name() const override { return "precast"; }
  OutputInfo infer(const Inputs& in) const override {
    check_defined(in[0], "precast");
    check_defined(in[1], "precast");
    MT_CHECK(in[0].shape() == in[1].shape(), "[precast] ", in[0].str(), " and its cast ", in[1].str(),
             " differ in shape");
    MT_CHECK(is_floating(in[0].dtype()) && is_floating(in[1].dtype()), "[precast] expects floating arrays, got ",
             in[0].str(), " and ", in[1].str());
    return {in[1].shape(), in[1].dtype()};
  }
  // A new handle on the cast's storage (the tape attaches its node to the output).
  Array run(const Inputs& in, const OutputInfo&, Inputs&) const override { return in[1].view_as_shape(in[1].shape()); }
  uint32_t keeps_inputs() const override { return 0; }
  Grads vjp(const Saved& s, const Array& g) const override { return {cast(g, s.dtypes[0]), Array()}; }
  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape& mesh) const override {
    return layout::rules::elementwise(in, mesh, Linearity::scaling);
  }
};

// An array of `value` shaped and laid out like its input (whose values it never reads); a
// partial-sum input gives a non-partial output without communicating.
class FillLikePrimitive final : public prim::Primitive {
 public:
  explicit FillLikePrimitive(double value) : value_(value) {}
  const char* name() const override { return "fill_like"; }
  OutputInfo infer(const Inputs& in) const override {
    check_defined(in[0], "fill_like");
    return {in[0].shape(), in[0].dtype()};
  }
  Array run(const Inputs&, const OutputInfo& o, Inputs&) const override { return Array::full(o.shape, value_, o.dtype); }
  bool differentiable(const Inputs&, const OutputInfo&) const override { return false; }
  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape&) const override {
    return {{in[0].spec}, in[0].spec.without_partial()};
  }
  prim::Cost cost(const Inputs&, const OutputInfo& o) const override {
    return {0, double(o.shape.numel()) * double(dtype_size(o.dtype))};
  }

 private:
  double value_;
};

#define MT_COUNT(...) +1
constexpr int kUnaryOps = 0 MT_UNARY_OPS(MT_COUNT);
constexpr int kBinaryOps = 0 MT_BINARY_OPS(MT_COUNT);
#undef MT_COUNT

// One shared instance per op of a primitive type parameterized by an op enum.
template <class P, class Op, int kCount>
const prim::PrimitivePtr& primitive_for(Op op) {
  static const std::vector<prim::PrimitivePtr> all = [] {
    std::vector<prim::PrimitivePtr> v;
    for (int i = 0; i < kCount; ++i) v.push_back(std::make_shared<P>(Op(i)));
    return v;
  }();
  return all[size_t(op)];
}

Array unary(UnaryOp op, const Array& x) {
  return prim::apply(primitive_for<UnaryPrimitive, UnaryOp, kUnaryOps>(op), {x});
}
Array binary(BinaryOp op, const Array& a, const Array& b) {
  return prim::apply(primitive_for<BinaryPrimitive, BinaryOp, kBinaryOps>(op), {a, b});
}

Array binary_moving_first(BinaryOp op, Array a, const Array& b) {
  std::vector<Array> in;  // built by moving: an initializer list would copy `a`
  in.reserve(2);
  in.push_back(std::move(a));
  in.push_back(b);
  return prim::apply_moving_first(primitive_for<BinaryPrimitive, BinaryOp, kBinaryOps>(op), std::move(in));
}

#define MT_NAME(e, name, ...) name,
MT_REGISTER_PRIMITIVES("elementwise", {MT_UNARY_OPS(MT_NAME) MT_BINARY_OPS(MT_NAME) "where", "cast", "precast", "fill_like"});
#undef MT_NAME

}  // namespace

Array add(const Array& a, const Array& b) { return binary(BinaryOp::add, a, b); }
Array add_in_place(Array a, const Array& b) { return binary_moving_first(BinaryOp::add, std::move(a), b); }
Array mul_in_place(Array a, const Array& b) { return binary_moving_first(BinaryOp::mul, std::move(a), b); }
Array sub(const Array& a, const Array& b) { return binary(BinaryOp::sub, a, b); }
Array mul(const Array& a, const Array& b) { return binary(BinaryOp::mul, a, b); }
Array div(const Array& a, const Array& b) { return binary(BinaryOp::div, a, b); }
Array pow(const Array& a, const Array& b) { return binary(BinaryOp::pow, a, b); }
Array pow(const Array& a, double exponent) { return pow(a, scalar_like(a, exponent)); }
Array maximum(const Array& a, const Array& b) { return binary(BinaryOp::maximum, a, b); }
Array minimum(const Array& a, const Array& b) { return binary(BinaryOp::minimum, a, b); }
Array eq(const Array& a, const Array& b) { return binary(BinaryOp::eq, a, b); }
Array ne(const Array& a, const Array& b) { return binary(BinaryOp::ne, a, b); }
Array lt(const Array& a, const Array& b) { return binary(BinaryOp::lt, a, b); }
Array le(const Array& a, const Array& b) { return binary(BinaryOp::le, a, b); }
Array gt(const Array& a, const Array& b) { return binary(BinaryOp::gt, a, b); }
Array ge(const Array& a, const Array& b) { return binary(BinaryOp::ge, a, b); }
Array logical_and(const Array& a, const Array& b) { return binary(BinaryOp::logical_and, a, b); }
Array logical_or(const Array& a, const Array& b) { return binary(BinaryOp::logical_or, a, b); }
Array logical_not(const Array& a) { return unary(UnaryOp::logical_not, a); }

Array neg(const Array& x) { return unary(UnaryOp::neg, x); }
Array exp(const Array& x) { return unary(UnaryOp::exp, x); }
Array log(const Array& x) { return unary(UnaryOp::log, x); }
Array sqrt(const Array& x) { return unary(UnaryOp::sqrt, x); }
Array rsqrt(const Array& x) { return unary(UnaryOp::rsqrt, x); }
Array tanh(const Array& x) { return unary(UnaryOp::tanh, x); }
Array abs(const Array& x) { return unary(UnaryOp::abs, x); }
Array sign(const Array& x) { return unary(UnaryOp::sign, x); }
Array square(const Array& x) { return unary(UnaryOp::square, x); }
Array reciprocal(const Array& x) { return unary(UnaryOp::reciprocal, x); }
Array erf(const Array& x) { return unary(UnaryOp::erf, x); }
Array sin(const Array& x) { return unary(UnaryOp::sin, x); }
Array cos(const Array& x) { return unary(UnaryOp::cos, x); }
Array sigmoid(const Array& x) { return unary(UnaryOp::sigmoid, x); }
Array gelu_vjp(const Array& x, const Array& g, bool approximate) {
  if (!autodiff::grad_enabled()) {
    // First order: one fused pass. A recorded backward (second order) composes ops.
    MT_CHECK(g.shape() == x.shape() && g.dtype() == x.dtype(), "[gelu] cotangent ", g.str(), " for input ", x.str());
    Array dx = Array::empty(x.shape(), x.dtype(), x.device());
    MT_KERNEL(dx, gelu_backward, x, g, approximate, dx);
    return dx;
  }
  if (!approximate) {
    // Φ(x) + x·φ(x)
    Array cdf = mul(add(erf(mul(x, M_SQRT1_2)), 1.0), 0.5);
    Array pdf = mul(exp(mul(mul(x, x), -0.5)), 1.0 / std::sqrt(2.0 * M_PI));
    return mul(g, add(cdf, mul(x, pdf)));
  }
  const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
  Array x2 = mul(x, x);
  Array t = tanh(mul(mul(x, add(mul(x2, c), 1.0)), k));
  Array left = mul(add(t, 1.0), 0.5);
  Array dt = mul(sub(ones_like(t), mul(t, t)), mul(add(mul(x2, 3.0 * c), 1.0), k));
  return mul(g, add(left, mul(mul(x, dt), 0.5)));
}

Array relu(const Array& x) { return unary(UnaryOp::relu, x); }
Array silu(const Array& x) { return unary(UnaryOp::silu, x); }
Array gelu(const Array& x, bool approximate) { return unary(approximate ? UnaryOp::gelu_tanh : UnaryOp::gelu_erf, x); }

Array where(const Array& cond, const Array& a, const Array& b) {
  return prim::apply(prim::instance<WherePrimitive>(), {cond, a, b});
}

Array cast(const Array& x, DType dtype) {
  check_defined(x, "cast");
  if (x.dtype() == dtype) return x;
  return prim::apply(primitive_for<CastPrimitive, DType, kNumDTypes>(dtype), {x});
}

Array precast(const Array& x, const Array& x_cast) {
  static const prim::PrimitivePtr primitive = std::make_shared<PrecastPrimitive>();
  return prim::apply(primitive, {x, x_cast});
}

Array scalar_like(const Array& a, double value) { return Array::full(Shape{}, value, a.dtype(), a.device()); }
Array zeros_like(const Array& a) {
  static const prim::PrimitivePtr zeros = std::make_shared<FillLikePrimitive>(0.0);
  return prim::apply(zeros, {a});
}
Array ones_like(const Array& a) {
  static const prim::PrimitivePtr ones = std::make_shared<FillLikePrimitive>(1.0);
  return prim::apply(ones, {a});
}
Array add(const Array& a, double b) { return add(a, scalar_like(a, b)); }
Array sub(const Array& a, double b) { return sub(a, scalar_like(a, b)); }
Array mul(const Array& a, double b) { return mul(a, scalar_like(a, b)); }
Array div(const Array& a, double b) { return div(a, scalar_like(a, b)); }

}  // namespace mt
