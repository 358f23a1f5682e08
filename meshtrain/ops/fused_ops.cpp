#include "meshtrain/ops/fused_ops.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/elementwise.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/backend/norm.h"
#include "meshtrain/backend/random.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/nn_ops.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("fused", {"bias_activation", "add_dropout", "add_dropout_layer_norm", "add_dropout_rms_norm"});

using layout::ArgInfo;
using layout::MeshShape;
using layout::RuleResult;
using layout::rules::Linearity;
using prim::OutputInfo;
using prim::Saved;
using Grads = std::vector<Array>;
using Inputs = std::vector<Array>;

namespace {

std::atomic<bool> g_fused_layers{[] {
  const char* v = std::getenv("MT_FUSED_LAYERS");
  return !(v && std::strcmp(v, "0") == 0);
}()};

kernels::UnaryOp unary_of(FusedActivation act) {
  switch (act) {
    case FusedActivation::relu: return kernels::UnaryOp::relu;
    case FusedActivation::gelu: return kernels::UnaryOp::gelu_erf;
    case FusedActivation::gelu_tanh: return kernels::UnaryOp::gelu_tanh;
  }
  return kernels::UnaryOp::relu;
}

Array as_dtype(const Array& a, DType dtype) { return a.dtype() == dtype ? a : cast(a, dtype); }

// The block of the global branch this rank holds, for masks drawn at global positions.
kernels::StreamBlock branch_block(const prim::LocalContext& ctx) {
  return kernels::StreamBlock{ctx.input_global[1].dims(), ctx.input_offsets[1]};
}

// ---- bias + activation ---------------------------------------------------------------

class BiasActivationPrimitive final : public prim::Primitive {
 public:
  explicit BiasActivationPrimitive(FusedActivation act) : act_(act) {}
  const char* name() const override { return "bias_activation"; }
  OutputInfo infer(const Inputs& in) const override {
    const Array &y = in[0], &bias = in[1];
    MT_CHECK(is_floating(y.dtype()) && is_floating(bias.dtype()), "[bias_activation] expects floating arrays, got ",
             y.str(), " and ", bias.str());
    MT_CHECK(y.ndim() >= 1 && bias.ndim() == 1 && bias.dim(0) == y.dim(-1), "[bias_activation] bias ", bias.str(),
             " does not match the last dim of ", y.str());
    return {y.shape(), y.dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    Array out = Array::empty(o.shape, o.dtype);
    if (out.numel() > 0) MT_KERNEL(out, bias_activation, unary_of(act_), in[0], in[1], out);
    return out;
  }
  Grads vjp(const Saved& s, const Array& g) const override {
    const Array &y = s.inputs[0], &bias = s.inputs[1];
    if (autodiff::grad_enabled()) {
      // Recorded (second order): the composed VJP, written with ops.
      Array pre = add(y, as_dtype(bias, y.dtype()));
      Array dpre = act_ == FusedActivation::relu ? where(gt(pre, zeros_like(pre)), g, zeros_like(g))
                                                  : gelu_vjp(pre, g, act_ == FusedActivation::gelu_tanh);
      return {dpre, s.wants(1) ? as_dtype(sum_to(dpre, bias.shape()), bias.dtype()) : Array()};
    }
    Array dpre = Array::empty(y.shape(), y.dtype(), y.device());
    Array dbias = s.wants(1) ? Array::empty(bias.shape(), bias.dtype(), y.device()) : Array();
    if (y.numel() > 0) {
      MT_KERNEL(dpre, bias_activation_backward, unary_of(act_), y, bias, as_dtype(g, y.dtype()), dpre,
                dbias.defined() ? &dbias : nullptr);
    } else if (dbias.defined()) {
      dbias = Array::full(bias.shape(), 0.0, bias.dtype(), y.device());
    }
    return {dpre, dbias};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::elementwise(in, mesh, Linearity::none);
  }
  prim::Cost cost(const Inputs& in, const OutputInfo& o) const override {
    const double n = double(o.shape.numel());
    return {12.0 * n, 2.0 * n * double(dtype_size(o.dtype))};
  }

 private:
  FusedActivation act_;
};

// ---- x + dropout(branch) ---------------------------------------------------------------

class AddDropoutPrimitive final : public prim::Primitive {
 public:
  AddDropoutPrimitive(double rate, RngKey key, kernels::StreamBlock block = {})
      : rate_(rate), key_(key), block_(std::move(block)) {}
  const char* name() const override { return "add_dropout"; }
  OutputInfo infer(const Inputs& in) const override {
    MT_CHECK(is_floating(in[0].dtype()), "[add_dropout] expects floating arrays, got ", in[0].str());
    MT_CHECK(in[0].shape() == in[1].shape() && in[0].dtype() == in[1].dtype(), "[add_dropout] residual ",
             in[0].str(), " and branch ", in[1].str(), " must have one shape and dtype");
    return {in[0].shape(), in[0].dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    Array out = Array::empty(o.shape, o.dtype);
    if (out.numel() > 0) MT_KERNEL(out, dropout_add, in[0], in[1], out, key_, rate_, block_);
    return out;
  }
  uint32_t keeps_inputs() const override { return 0; }
  Grads vjp(const Saved& s, const Array& g) const override {
    // Linear: the residual gets g, the branch dropout(g) with the forward's mask.
    if (autodiff::grad_enabled()) return {g, dropout(g, rate_, key_, true)};
    Array dbranch = Array::empty(g.shape(), g.dtype(), g.device());
    if (g.numel() > 0) MT_KERNEL(dbranch, dropout, g, dbranch, key_, rate_, block_);
    return {g, dbranch};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::elementwise(in, mesh, Linearity::additive);
  }
  prim::PrimitivePtr localize(const prim::LocalContext& ctx, const prim::PrimitivePtr&) const override {
    return std::make_shared<AddDropoutPrimitive>(rate_, key_, branch_block(ctx));
  }
  prim::Cost cost(const Inputs& in, const OutputInfo& o) const override {
    const double n = double(o.shape.numel());
    return {3.0 * n, 3.0 * n * double(dtype_size(o.dtype))};
  }

 private:
  double rate_;
  RngKey key_;
  kernels::StreamBlock block_;
};

// ---- norm(x + dropout(branch)) -----------------------------------------------------------

void check_residual_norm_inputs(const char* op, const Array& x, const Array& branch, const Array& weight,
                                const Array& bias, double eps) {
  check_norm_arguments(op, x, weight, bias, eps);
  MT_CHECK(x.shape() == branch.shape() && x.dtype() == branch.dtype(), "[", op, "] residual ", x.str(), " and branch ",
           branch.str(), " must have one shape and dtype");
}

// Inputs x, branch, weight, bias (either may be undefined). The kernel keeps the sum and the
// row statistics; x and branch are kept only when built inside a nested trace, whose recorded
// backward differentiates the composed ops.
class AddDropoutNormPrimitive final : public prim::Primitive {
 public:
  AddDropoutNormPrimitive(bool center, double eps, double rate, RngKey key, bool nested,
                          kernels::StreamBlock block = {})
      : center_(center), eps_(eps), rate_(rate), key_(key), nested_(nested), block_(std::move(block)) {}
  const char* name() const override { return center_ ? "add_dropout_layer_norm" : "add_dropout_rms_norm"; }
  OutputInfo infer(const Inputs& in) const override {
    check_residual_norm_inputs(name(), in[0], in[1], in[2], in[3], eps_);
    return {in[0].shape(), in[0].dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs& aux) const override {
    const Array& x = in[0];
    const int64_t rows = x.numel() / x.dim(-1);
    Array y = Array::empty(o.shape, o.dtype);
    Array mean_saved = Array::empty({rows}, DType::f32), rstd_saved = Array::empty({rows}, DType::f32);
    kernels::DropoutBranch branch{in[1], Array::empty(x.shape(), x.dtype()), Array(), key_, rate_, block_};
    if (x.numel() > 0) MT_KERNEL(x, norm_forward, center_, x, in[2], in[3], eps_, y, mean_saved, rstd_saved, &branch);
    aux = {branch.sum, mean_saved, rstd_saved};
    return y;
  }
  uint32_t keeps_inputs() const override { return nested_ ? ~0u : 1u << 2; }
  Grads vjp(const Saved& s, const Array& g) const override {
    const Array& weight = s.inputs[2];
    if (autodiff::grad_enabled()) {
      MT_CHECK(s.inputs[0].defined() && s.inputs[1].defined(), "[", name(),
               "] a recorded (second-order) backward needs the op built inside the nested trace");
      // Recorded (second order): the sum formed again with history, the norm's composed VJP,
      // and the branch's share through the same dropout.
      Array sum = add(s.inputs[0], dropout(s.inputs[1], rate_, key_, true));
      Grads d = norm_vjp(center_, sum, weight, s.inputs[3], eps_, g);
      return {d[0], dropout(d[0], rate_, key_, true), d[1], d[2]};
    }
    const Array& sum = s.aux[0];
    Array gx = as_dtype(g, sum.dtype());
    Array dx = Array::empty(sum.shape(), sum.dtype(), sum.device());
    kernels::DropoutBranch branch{Array(), Array(), Array::empty(sum.shape(), sum.dtype(), sum.device()), key_, rate_,
                                  block_};
    Array dw, db;
    if (weight.defined() && s.wants(2)) dw = Array::empty(weight.shape(), weight.dtype(), sum.device());
    if (s.shapes[3].ndim() > 0 && s.wants(3)) db = Array::empty(s.shapes[3], s.dtypes[3], sum.device());
    if (sum.numel() > 0)
      MT_KERNEL(gx, norm_backward, center_, gx, sum, weight, s.aux[1], s.aux[2], dx, dw.defined() ? &dw : nullptr,
                db.defined() ? &db : nullptr, &branch);
    return {dx, branch.grad, dw, db};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    // x and branch in x's layout with the normalized dim whole (partial sums reduced first);
    // weight and bias replicated.
    layout::PartitionSpec s = in[0].spec.without_partial().padded(in[0].shape.ndim());
    s.dims.back().clear();
    RuleResult r;
    r.inputs = {s, s, {}, {}};
    r.output = s;
    return r;
  }
  prim::PrimitivePtr localize(const prim::LocalContext& ctx, const prim::PrimitivePtr&) const override {
    return std::make_shared<AddDropoutNormPrimitive>(center_, eps_, rate_, key_, nested_, branch_block(ctx));
  }
  prim::Cost cost(const Inputs& in, const OutputInfo& o) const override {
    const double n = double(o.shape.numel());
    return {11.0 * n, 4.0 * n * double(dtype_size(o.dtype))};
  }

 private:
  bool center_;
  double eps_, rate_;
  RngKey key_;
  bool nested_;
  kernels::StreamBlock block_;
};

Array add_dropout_norm(bool center, const Array& x, const Array& branch, const Array& weight, const Array& bias,
                       double eps, double rate, const RngKey& key, bool train) {
  const char* op = center ? "add_dropout_layer_norm" : "add_dropout_rms_norm";
  MT_CHECK(x.defined() && branch.defined(), "[", op, "] undefined input array");
  MT_CHECK(rate >= 0.0 && rate <= 1.0, "[", op, "] dropout rate ", rate, " outside [0, 1]");
  const double r = train ? rate : 0.0;
  return prim::apply(std::make_shared<AddDropoutNormPrimitive>(center, eps, r, key, autodiff::trace_depth() > 1),
                     {x, branch, weight, bias});
}

}  // namespace

Array bias_activation(const Array& y, const Array& bias, FusedActivation act) {
  MT_CHECK(y.defined() && bias.defined(), "[bias_activation] undefined input array");
  return prim::apply(std::make_shared<BiasActivationPrimitive>(act), {y, bias});
}

Array add_dropout(const Array& x, const Array& branch, double rate, const RngKey& key, bool train) {
  MT_CHECK(x.defined() && branch.defined(), "[add_dropout] undefined input array");
  MT_CHECK(rate >= 0.0 && rate <= 1.0, "[add_dropout] rate ", rate, " outside [0, 1] for ", branch.str());
  return prim::apply(std::make_shared<AddDropoutPrimitive>(train ? rate : 0.0, key), {x, branch});
}

Array add_dropout_layer_norm(const Array& x, const Array& branch, const Array& weight, const Array& bias, double eps,
                             double rate, const RngKey& key, bool train) {
  return add_dropout_norm(true, x, branch, weight, bias, eps, rate, key, train);
}

Array add_dropout_rms_norm(const Array& x, const Array& branch, const Array& weight, double eps, double rate,
                           const RngKey& key, bool train) {
  return add_dropout_norm(false, x, branch, weight, Array(), eps, rate, key, train);
}

void set_fused_layers(bool on) { g_fused_layers.store(on); }
bool fused_layers() { return g_fused_layers.load(); }

}  // namespace mt
