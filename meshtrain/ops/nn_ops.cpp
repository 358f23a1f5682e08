#include "meshtrain/ops/nn_ops.h"

#include <cmath>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/cpu/norm_kernels.h"
#include "meshtrain/backend/cpu/softmax_kernel.h"
#include "meshtrain/core/error.h"
#include "meshtrain/dist/rules.h"
#include "meshtrain/dist/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt {

using autodiff::record;
using Grads = std::vector<Array>;

namespace {

// The op's output inside its VJP: the saved value in a first-order pass, recomputed with
// history when the backward pass is itself being differentiated.
template <class Recompute>
Array saved_output(const Array& detached_out, Recompute&& recompute) {
  return autodiff::grad_enabled() ? recompute() : detached_out;
}

Array to_f32(const Array& a) { return cast(a, DType::f32); }

// ---- softmax ---------------------------------------------------------------------

Array softmax_impl(const Array& x, int axis, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  MT_CHECK(x.defined(), "[", op, "] undefined input array");
  MT_CHECK(is_floating(x.dtype()), "[", op, "] expects a floating array, got ", x.str());
  axis = x.shape().axis(axis, op);
  if (dist::is_sharded(x))
    return dist::spmd_call(op, {x}, dist::rules::gather_dims({axis}),
                           [&](const std::vector<Array>& l) { return softmax_impl(l[0], axis, log); });
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= x.shape()[i];
  for (int i = axis + 1; i < x.ndim(); ++i) inner *= x.shape()[i];
  Array y = Array::empty(x.shape(), x.dtype());
  if (x.numel() > 0) cpu::softmax_forward(x, y, outer, x.shape()[axis], inner, log);
  // VJPs in f32 (bf16 products and row sums would lose the small differences they rely on).
  if (log)
    record(y, op, {x}, [x, axis, o = y.detach()](const Array& g) {
      Array yv = saved_output(o, [&] { return softmax_impl(x, axis, true); });
      Array gf = to_f32(g);
      Array dx = sub(gf, mul(exp(to_f32(yv)), sum(gf, {axis}, true)));
      return Grads{cast(dx, x.dtype())};
    });
  else
    record(y, op, {x}, [x, axis, o = y.detach()](const Array& g) {
      Array yf = to_f32(saved_output(o, [&] { return softmax_impl(x, axis, false); }));
      Array gf = to_f32(g);
      Array dx = mul(yf, sub(gf, sum(mul(gf, yf), {axis}, true)));
      return Grads{cast(dx, x.dtype())};
    });
  return y;
}

// ---- layer norm / RMS norm ---------------------------------------------------------

void check_norm_inputs(const char* op, const Array& x, const Array& weight, const Array& bias, double eps) {
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
Grads norm_vjp_composed(bool center, const Array& x, const Array& weight, const Array& bias, double eps,
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

Array norm_impl(bool center, const Array& x, const Array& weight, const Array& bias, double eps) {
  const char* op = center ? "layer_norm" : "rms_norm";
  check_norm_inputs(op, x, weight, bias, eps);
  if (dist::any_sharded({x, weight, bias}))
    return dist::spmd_call(op, {x, weight, bias}, dist::rules::gather_dims({x.ndim() - 1}),
                           [&](const std::vector<Array>& l) { return norm_impl(center, l[0], l[1], l[2], eps); });
  const int64_t rows = x.numel() / x.dim(-1);
  Array y = Array::empty(x.shape(), x.dtype());
  Array mean_saved = Array::empty({rows}, DType::f32), rstd_saved = Array::empty({rows}, DType::f32);
  cpu::norm_forward(center, x, weight, bias, eps, y, mean_saved, rstd_saved);
  record(y, op, {x, weight, bias}, [center, x, weight, bias, eps, mean_saved, rstd_saved](const Array& g) -> Grads {
    if (autodiff::grad_enabled()) return norm_vjp_composed(center, x, weight, bias, eps, g);
    // First order: one fused pass from the saved statistics.
    Array gx = g.dtype() == x.dtype() ? g : cast(g, x.dtype());
    Array dx = Array::empty(x.shape(), x.dtype());
    Array dw, db;
    if (weight.defined() && weight.traced()) dw = Array::empty(weight.shape(), weight.dtype());
    if (bias.defined() && bias.traced()) db = Array::empty(bias.shape(), bias.dtype());
    cpu::norm_backward(center, gx, x, weight, mean_saved, rstd_saved, dx, dw.defined() ? &dw : nullptr,
                       db.defined() ? &db : nullptr);
    return Grads{dx, dw, db};
  });
  return y;
}

}  // namespace

Array softmax(const Array& x, int axis) { return softmax_impl(x, axis, false); }
Array log_softmax(const Array& x, int axis) { return softmax_impl(x, axis, true); }

Array layer_norm(const Array& x, const Array& weight, const Array& bias, double eps) {
  return norm_impl(true, x, weight, bias, eps);
}

Array rms_norm(const Array& x, const Array& weight, double eps) { return norm_impl(false, x, weight, Array(), eps); }

}  // namespace mt
