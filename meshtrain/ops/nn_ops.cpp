#include "meshtrain/ops/nn_ops.h"

#include <cmath>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/norm.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/backend/softmax.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("nn", {"softmax", "log_softmax", "layer_norm", "rms_norm"});

using layout::ArgInfo;
using layout::MeshShape;
using layout::RuleResult;
using prim::OutputInfo;
using prim::Saved;
using Grads = std::vector<Array>;
using Inputs = std::vector<Array>;

namespace {

Array to_f32(const Array& a) { return cast(a, DType::f32); }

// ---- softmax ---------------------------------------------------------------------

class SoftmaxPrimitive final : public prim::Primitive {
 public:
  SoftmaxPrimitive(int axis, bool log) : axis_(axis), log_(log) {}
  const char* name() const override { return log_ ? "log_softmax" : "softmax"; }
  // A softmax is the composed attention's (over the scores); log_softmax belongs to losses.
  prim::OpKind kind() const override { return log_ ? prim::OpKind::other : prim::OpKind::attention; }
  OutputInfo infer(const Inputs& in) const override {
    MT_CHECK(is_floating(in[0].dtype()), "[", name(), "] expects a floating array, got ", in[0].str());
    return {in[0].shape(), in[0].dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const Array& x = in[0];
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis_; ++i) outer *= x.shape()[i];
    for (int i = axis_ + 1; i < x.ndim(); ++i) inner *= x.shape()[i];
    Array y = Array::empty(o.shape, o.dtype);
    if (x.numel() > 0) MT_KERNEL(x, softmax_forward, x, y, outer, x.shape()[axis_], inner, log_);
    return y;
  }
  bool keeps_output() const override { return true; }
  // In f32: bf16 products and row sums would lose the small differences the VJP relies on.
  Grads vjp(const Saved& s, const Array& g) const override {
    Array gf = to_f32(g);
    Array yf = to_f32(s.output_for_vjp());
    Array dx = log_ ? sub(gf, mul(exp(yf), sum(gf, {axis_}, true))) : mul(yf, sub(gf, sum(mul(gf, yf), {axis_}, true)));
    return {cast(dx, s.dtypes[0])};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::gather_dims(in, mesh, {axis_});
  }
  prim::Cost cost(const Inputs& in, const OutputInfo& o) const override {
    return {5.0 * double(o.shape.numel()), 2.0 * double(o.shape.numel()) * double(dtype_size(o.dtype))};
  }

 private:
  int axis_;
  bool log_;
};

Array softmax_impl(const Array& x, int axis, bool log) {
  MT_CHECK(x.defined(), "[", log ? "log_softmax" : "softmax", "] undefined input array");
  axis = x.shape().axis(axis, log ? "log_softmax" : "softmax");
  return prim::apply(std::make_shared<SoftmaxPrimitive>(axis, log), {x});
}

// ---- layer norm / RMS norm ---------------------------------------------------------

// layer_norm(x, weight, bias) / rms_norm(x, weight): inputs x, weight, bias (either may be
// undefined); the kernel saves each row's mean and 1/std for the fused backward.
class NormPrimitive final : public prim::Primitive {
 public:
  NormPrimitive(bool center, double eps) : center_(center), eps_(eps) {}
  const char* name() const override { return center_ ? "layer_norm" : "rms_norm"; }
  OutputInfo infer(const Inputs& in) const override {
    check_norm_arguments(name(), in[0], in[1], in[2], eps_);
    return {in[0].shape(), in[0].dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs& aux) const override {
    const Array& x = in[0];
    const int64_t rows = x.numel() / x.dim(-1);
    Array y = Array::empty(o.shape, o.dtype);
    Array mean_saved = Array::empty({rows}, DType::f32), rstd_saved = Array::empty({rows}, DType::f32);
    MT_KERNEL(x, norm_forward, center_, x, in[1], in[2], eps_, y, mean_saved, rstd_saved);
    aux = {mean_saved, rstd_saved};
    return y;
  }
  Grads vjp(const Saved& s, const Array& g) const override {
    const Array &x = s.inputs[0], &weight = s.inputs[1], &bias = s.inputs[2];
    if (autodiff::grad_enabled()) return norm_vjp(center_, x, weight, bias, eps_, g);
    // First order: one fused pass from the saved statistics.
    Array gx = g.dtype() == x.dtype() ? g : cast(g, x.dtype());
    Array dx = Array::empty(x.shape(), x.dtype(), x.device());
    Array dw, db;
    if (weight.defined() && s.wants(1)) dw = Array::empty(weight.shape(), weight.dtype(), x.device());
    if (bias.defined() && s.wants(2)) db = Array::empty(bias.shape(), bias.dtype(), x.device());
    MT_KERNEL(gx, norm_backward, center_, gx, x, weight, s.aux[0], s.aux[1], dx, dw.defined() ? &dw : nullptr,
                       db.defined() ? &db : nullptr);
    return {dx, dw, db};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::gather_dims(in, mesh, {in[0].shape.ndim() - 1});
  }
  prim::Cost cost(const Inputs& in, const OutputInfo& o) const override {
    return {8.0 * double(o.shape.numel()), 2.0 * double(o.shape.numel()) * double(dtype_size(o.dtype))};
  }

 private:
  bool center_;
  double eps_;
};

Array norm_impl(bool center, const Array& x, const Array& weight, const Array& bias, double eps) {
  MT_CHECK(x.defined(), "[", center ? "layer_norm" : "rms_norm", "] undefined input array");
  return prim::apply(std::make_shared<NormPrimitive>(center, eps), {x, weight, bias});
}

}  // namespace

void check_norm_arguments(const char* op, const Array& x, const Array& weight, const Array& bias, double eps) {
  MT_CHECK(x.defined(), "[", op, "] undefined input array");
  MT_CHECK(is_floating(x.dtype()), "[", op, "] expects a floating input, got ", x.str());
  MT_CHECK(x.ndim() >= 1 && x.dim(-1) > 0, "[", op, "] needs a non-empty last dimension to normalize, got ",
           x.str());
  MT_CHECK(std::isfinite(eps) && eps >= 0, "[", op, "] eps must be finite and >= 0, got ", eps);
  const Shape feature{x.dim(-1)};
  for (auto [name, p] : {std::pair<const char*, const Array*>{"weight", &weight}, {"bias", &bias}}) {
    if (!p->defined()) continue;
    MT_CHECK(is_floating(p->dtype()), "[", op, "] ", name, " must be floating, got ", p->str());
    MT_CHECK(p->shape() == feature, "[", op, "] ", name, " shape ", p->shape().str(), " does not match ",
             feature.str(), " (the last dim of input ", x.str(), ")");
  }
  MT_CHECK(!weight.defined() || !bias.defined() || weight.dtype() == bias.dtype(), "[", op,
           "] weight and bias dtypes differ: ", weight.str(), " vs ", bias.str());
}

// The norms' VJP composed from ops, in f32: used when the backward pass is itself
// recorded (exact higher-order gradients) and as the reference for the fused kernel.
std::vector<Array> norm_vjp(bool center, const Array& x, const Array& weight, const Array& bias, double eps,
                        const Array& g) {
  Array xf = to_f32(x), gf = to_f32(g);
  Array xc = center ? sub(xf, mean(xf, {-1}, true)) : xf;
  Array rs = rsqrt(add(mean(mul(xc, xc), {-1}, true), eps));
  Array xhat = mul(xc, rs);
  Array gy = weight.defined() ? mul(gf, to_f32(weight)) : gf;
  Array t = sub(gy, mul(xhat, mean(mul(gy, xhat), {-1}, true)));
  if (center) t = sub(t, mean(gy, {-1}, true));
  const Shape feature{x.dim(-1)};
  Grads out{cast(mul(rs, t), x.dtype()), Array(), Array()};
  if (weight.defined()) out[1] = cast(sum_to(mul(gf, xhat), feature), weight.dtype());
  if (bias.defined()) out[2] = cast(sum_to(gf, feature), bias.dtype());
  return out;
}

Array softmax(const Array& x, int axis) { return softmax_impl(x, axis, false); }
Array log_softmax(const Array& x, int axis) { return softmax_impl(x, axis, true); }

Array layer_norm(const Array& x, const Array& weight, const Array& bias, double eps) {
  return norm_impl(true, x, weight, bias, eps);
}

Array rms_norm(const Array& x, const Array& weight, double eps) { return norm_impl(false, x, weight, Array(), eps); }

}  // namespace mt
