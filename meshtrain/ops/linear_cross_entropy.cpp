#include "meshtrain/ops/linear_cross_entropy.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/backend/loss.h"
#include "meshtrain/backend/matmul.h"
#include "meshtrain/core/error.h"
#include "meshtrain/layout/rules.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/index_checks.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("linear_cross_entropy", {"linear_cross_entropy"});

namespace {

std::atomic<int64_t> g_gpu_pad{[] {
  const char* v = std::getenv("MT_PAD_VOCAB");
  return v && std::string(v) == "0" ? int64_t(1) : int64_t(128);
}()};
std::atomic<int64_t> g_cpu_pad{1};

// Rows [r0, r0 + n) of a contiguous (N, W) array, as an (n, W) view of its storage.
Array rows_of(const Array& x, int64_t r0, int64_t n) {
  const int64_t w = x.numel() / std::max<int64_t>(1, x.dim(0));
  return x.view_as_shape(Shape{x.numel()}).view_elements(r0 * w, Shape{n, w});
}

// The kernels' dtype for a product of a's dtype into out: bf16 operands may write an f32 out
// (a sum over chunks kept in f32); f32 operands multiply as the matmul precision says.
kernels::MatmulDType kernel_dtype(const Array& a, const Array& out, MatmulPrecision precision) {
  kernels::MatmulDType dtype = matmul_kernel_dtype(a.dtype(), precision);
  if (dtype == kernels::MatmulDType::bf16 && out.dtype() == DType::f32) dtype = kernels::MatmulDType::bf16_f32;
  return dtype;
}

// out = op(a) · op(b) (or += with accumulate) on 2-D views, straight into out's storage. The
// operands share a dtype; out has it too, or is f32 for bf16 operands (a sum over chunks kept
// in f32). f32 operands multiply as the matmul precision says.
void gemm_into(Array& out, const Array& a, const Array& b, bool ta, bool tb, bool accumulate, MatmulPrecision precision) {
  const int64_t m = out.dim(0), n = out.dim(1), k = ta ? a.dim(0) : a.dim(1);
  MT_KERNEL(out, matmul, kernel_dtype(a, out, precision), a.raw(), b.raw(), out.raw(), 1, 1, 1, m, n, k, ta, tb,
            accumulate);
}

// out = a · bᵀ + bias (bias (N,) in out's dtype), the bias in the product's epilogue as
// linear_bias adds it (rounded as matmul + add round it).
void gemm_bias_into(Array& out, const Array& a, const Array& b, const Array& bias, MatmulPrecision precision) {
  MT_KERNEL(out, matmul_bias, kernel_dtype(a, out, precision), a.raw(), b.raw(), bias.raw(), out.raw(), out.dim(0),
            out.dim(1), a.dim(1), false, true);
}

void check_shapes(const Array& hidden, const Array& weight, const Array& labels, const Array& bias) {
  MT_CHECK(hidden.defined() && weight.defined() && labels.defined(),
           "[linear_cross_entropy] undefined hidden, weight or labels array");
  MT_CHECK(is_floating(hidden.dtype()) && hidden.ndim() >= 1, "[linear_cross_entropy] hidden must be floating (..., C), got ",
           hidden.str());
  MT_CHECK(weight.ndim() == 2 && weight.dim(1) == hidden.dim(-1) && weight.dtype() == hidden.dtype() && weight.dim(0) > 0,
           "[linear_cross_entropy] weight must be (V, C) with C = ", hidden.dim(-1), " in hidden's dtype, got weight ",
           weight.str(), " for hidden ", hidden.str());
  MT_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64,
           "[linear_cross_entropy] labels must be i32 or i64, got ", labels.str());
  std::vector<int64_t> lead(hidden.shape().dims().begin(), hidden.shape().dims().end() - 1);
  MT_CHECK(labels.shape() == Shape(lead), "[linear_cross_entropy] labels ", labels.str(), " must have shape ",
           Shape(lead).str(), " for hidden ", hidden.str());
  MT_CHECK(!bias.defined() || (bias.ndim() == 1 && bias.dim(0) == weight.dim(0) && bias.dtype() == hidden.dtype()),
           "[linear_cross_entropy] bias must be (V,) with V = ", weight.dim(0), " in hidden's dtype, got ",
           bias.defined() ? bias.str() : "none", " for hidden ", hidden.str());
}


// Inputs (hidden (..., C), weight (V, C), labels (...), optionally bias (V,)); output the f32
// loss. aux: the gradients of hidden, weight and bias for a unit cotangent (undefined where
// none is wanted).
class LinearCrossEntropyPrimitive final : public prim::Primitive {
 public:
  LinearCrossEntropyPrimitive(int64_t ignore_index, double smoothing, Reduction reduction, int64_t chunk_logits,
                              bool hidden_grad, bool weight_grad, bool bias_grad)
      : ignore_index_(ignore_index),
        smoothing_(smoothing),
        reduction_(reduction),
        chunk_logits_(chunk_logits),
        hidden_grad_(hidden_grad),
        weight_grad_(weight_grad),
        bias_grad_(bias_grad),
        precision_(matmul_precision()) {}
  const char* name() const override { return "linear_cross_entropy"; }
  prim::OpKind kind() const override { return prim::OpKind::gemm; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    check_shapes(in[0], in[1], in[2], in.size() > 3 ? in[3] : Array());
    return {Shape{}, DType::f32};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo&, std::vector<Array>& aux) const override {
    autodiff::NoGradGuard no_grad;
    const Array& weight = in[1];
    const int64_t rows = in[2].numel(), c = weight.dim(1), v = weight.dim(0);
    const Device device = weight.device();
    const Array hidden = in[0].view_as_shape(Shape{rows, c});
    // Validated on the device and counted there, as cross_entropy's labels.
    const Array labels = checked_indices(
        in[2].view_as_shape(Shape{rows}), v, "linear_cross_entropy",
        [v, ignore = ignore_index_, hs = in[0].shape(), yd = in[2].dtype(), ys = in[2].shape()](int64_t position,
                                                                                                int64_t value) {
          return detail::concat("[linear_cross_entropy] label ", value, " out of range for ", v,
                                " classes at flat position ", position, " (hidden ", hs.str(), ", labels ",
                                dtype_name(yd), ys.str(), ", ignore_index ", ignore, ")");
        },
        ignore_index_);
    Array count = Array::empty(Shape{}, DType::i64, device);
    MT_KERNEL(labels, cross_entropy_count, labels, ignore_index_, count);
    Array losses = Array::empty(Shape{rows}, DType::f32, device);
    const bool grads = hidden_grad_ || weight_grad_ || bias_grad_;
    Array dhidden = hidden_grad_ ? Array::empty(Shape{rows, c}, hidden.dtype(), device) : Array();
    // The weight's gradient sums over every chunk: in f32, as one GEMM over all rows would.
    Array dweight;
    // The gradient of each row's logits for a unit cotangent: the mean's 1 / count (1 when
    // every target is ignored: the gradient is then 0, not NaN) or the sum's 1.
    Array row_scale;
    if (grads) {
      Array scale = Array::scalar(1.0, DType::f32, device);
      if (reduction_ == Reduction::mean) scale = div(scale, maximum(cast(count, DType::f32), scale));
      row_scale = broadcast_to(scale, Shape{rows});
    }
    // The GEMMs see vp classes: the weight's extra rows are zeros, so the logits' extra
    // columns are 0 (the loss kernels skip them and give them no gradient) and the products
    // over vp equal those over v.
    const int64_t pad = vocab_pad_multiple(device.is_cuda()), vp = (v + pad - 1) / pad * pad;
    const Array w =
        vp == v ? weight : concatenate({weight, Array::zeros(Shape{vp - v, c}, weight.dtype(), device)}, 0);
    Array bias;  // in the logits' dtype (f32 for f32 products whatever the precision), padded as w
    if (in.size() > 3) {
      bias = in[3];
      if (vp != v) bias = concatenate({bias, Array::zeros(Shape{vp - v}, bias.dtype(), device)}, 0);
    }
    // The bias's gradient, the sum of the logits' gradients over every row: ones · dz summed
    // over the chunks into an f32 row, as dweight (no f32 copy of a 16-bit chunk).
    Array dbias = bias_grad_ ? Array::zeros(Shape{1, vp}, DType::f32, device) : Array();
    // Summed over the chunks from the first one's product on (no rows: no product, zeros).
    if (weight_grad_) dweight = rows > 0 ? Array::empty(Shape{vp, c}, DType::f32, device)
                                         : Array::zeros(Shape{vp, c}, DType::f32, device);
    const int64_t chunk = std::clamp<int64_t>(chunk_logits_ / vp, 1, std::max<int64_t>(rows, 1));
    Array logits = Array::empty(Shape{chunk, vp}, hidden.dtype(), device);
    const Array ones = bias_grad_ ? Array::full(Shape{chunk}, 1.0, hidden.dtype(), device) : Array();
    Array dlogits = grads ? Array::empty(Shape{chunk, vp}, hidden.dtype(), device) : Array();
    Array lse = Array::empty(Shape{chunk}, DType::f32, device);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      const Array h = rows_of(hidden, r0, n), y1 = labels.view_elements(r0, Shape{n});
      Array z = rows_of(logits, 0, n), lse_n = lse.view_elements(0, Shape{n}), loss_n = losses.view_elements(r0, Shape{n});
      if (bias.defined()) gemm_bias_into(z, h, w, bias, precision_);
      else gemm_into(z, h, w, false, true, false, precision_);
      MT_KERNEL(z, cross_entropy_forward, z, y1, v, ignore_index_, float(smoothing_), loss_n, lse_n);
      if (!grads) continue;
      Array dz = rows_of(dlogits, 0, n);
      MT_KERNEL(z, cross_entropy_backward, z, y1, v, lse_n, row_scale.view_elements(r0, Shape{n}), ignore_index_,
                float(smoothing_), dz);
      if (hidden_grad_) {
        Array dh = rows_of(dhidden, r0, n);
        gemm_into(dh, dz, w, false, false, false, precision_);
      }
      if (weight_grad_) gemm_into(dweight, dz, h, true, false, r0 > 0, precision_);
      if (bias_grad_) gemm_into(dbias, ones.view_elements(0, Shape{1, n}), dz, false, false, true, MatmulPrecision::f32);
    }
    Array total = Array::empty(Shape{}, DType::f32, device);
    MT_KERNEL(losses, cross_entropy_total, losses, count, reduction_ == Reduction::mean, total);
    if (hidden_grad_) dhidden = dhidden.view_as_shape(in[0].shape());
    if (weight_grad_) {
      if (vp != v) dweight = rows_of(dweight, 0, v);  // the real classes' rows (a view)
      dweight = weight.dtype() != DType::f32 ? cast(dweight, weight.dtype()) : vp != v ? dweight.clone() : dweight;
    }
    if (bias_grad_) {
      dbias = dbias.view_as_shape(Shape{vp});
      if (vp != v) dbias = slice(dbias, 0, 0, v);
      if (bias.dtype() != DType::f32) dbias = cast(dbias, bias.dtype());
    }
    aux = {dhidden, dweight, dbias};
    return total;
  }
  uint32_t keeps_inputs() const override { return 0u; }  // the gradients were made forward
  // Data parallel (the summed loss only): each rank takes its rows against the whole weight
  // and bias, and the output is partial over the rows' axes. A weight split over those axes
  // (FSDP) is gathered for the op and its gradient, partial from each rank's rows,
  // reduce-scattered back; the (rows, V) logits still never exist whole. Other reductions
  // compute everything everywhere (always correct; linear_cross_entropy routes the
  // distributed mean through the sum).
  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape& mesh) const override {
    if (reduction_ != Reduction::sum) return layout::rules::replicate_all(in, mesh);
    // Hidden and labels laid out as the summed cross_entropy's logits and labels.
    layout::RuleResult r = layout::rules::cross_entropy({in[0], in[2]}, mesh, true);
    r.inputs.insert(r.inputs.begin() + 1, layout::PartitionSpec{});  // the weight, whole
    if (in.size() > 3) r.inputs.emplace_back();                        // the bias, whole
    return r;
  }
  std::vector<Array> vjp(const prim::Saved& s, const Array& g) const override {
    MT_CHECK(!autodiff::grad_enabled(),
             "[linear_cross_entropy] the chunked form has no recorded backward (nested differentiation uses the "
             "composed form)");
    auto scaled = [&](const Array& unit) {
      return unit.defined() ? mul(unit, g.dtype() == unit.dtype() ? g : cast(g, unit.dtype())) : Array();
    };
    std::vector<Array> grads = {scaled(s.aux[0]), scaled(s.aux[1]), Array()};
    if (s.inputs.size() > 3) grads.push_back(scaled(s.aux[2]));
    return grads;
  }
  // The three GEMMs of the head (forward, and the backward's two when a gradient is wanted)
  // run here, so their model FLOPs count here: the same total per step as the composed form.
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo&) const override {
    const double gemm = 2.0 * double(in[2].numel()) * double(in[1].dim(0)) * double(in[1].dim(1));
    const int gemms = 1 + int(hidden_grad_) + int(weight_grad_);
    return {gemms * gemm, double(in[1].nbytes()) * gemms + double(in[0].nbytes()) * 2};
  }
  bool counts_model_flops() const override { return true; }

 private:
  int64_t ignore_index_;
  double smoothing_;
  Reduction reduction_;
  int64_t chunk_logits_;
  bool hidden_grad_, weight_grad_, bias_grad_;
  MatmulPrecision precision_;  // in force when the op ran: how f32 GEMMs multiply
};

// Rows split over some mesh axes and classes whole (hidden's last dim unsplit), with the
// weight and bias split over none but those axes (FSDP) or replicated: the fused op runs per
// rank on its rows. Otherwise (a weight split over classes on an axis the rows do not use:
// the tensor-parallel head) the composed form's vocab-parallel cross-entropy runs, which
// never gathers the weight. A weight split over classes on a row axis is gathered either way
// (the composed matmul's rule gathers it too, the rows holding that axis).
bool data_parallel(const Array& hidden, const Array& weight, const Array& bias) {
  const layout::PartitionSpec hs = prim::spec_of(hidden).padded(hidden.ndim());
  if (!hs.axes_of(hidden.ndim() - 1).empty() || !hs.partial.empty()) return false;
  const std::vector<std::string> row_axes = hs.used_axes();
  auto within_rows = [&](const Array& a) {
    if (!a.defined()) return true;
    const layout::PartitionSpec s = prim::spec_of(a);
    if (!s.partial.empty()) return false;
    for (const std::string& axis : s.used_axes())
      if (std::find(row_axes.begin(), row_axes.end(), axis) == row_axes.end()) return false;
    return true;
  };
  return !row_axes.empty() && within_rows(weight) && within_rows(bias);
}

}  // namespace

Array linear_cross_entropy(const Array& hidden, const Array& weight, const Array& labels, int64_t ignore_index,
                           double label_smoothing, Reduction reduction, int64_t chunk_logits, const Array& bias) {
  check_shapes(hidden, weight, labels, bias);
  MT_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, "[linear_cross_entropy] label_smoothing ",
           label_smoothing, " outside [0, 1]");
  MT_CHECK(chunk_logits > 0, "[linear_cross_entropy] chunk_logits must be positive, got ", chunk_logits);
  const bool distributed =
      hidden.distributed() || weight.distributed() || labels.distributed() || (bias.defined() && bias.distributed());
  const bool composed = reduction == Reduction::none || (distributed && !data_parallel(hidden, weight, bias)) ||
                        hidden.dtype() == DType::f16 || autodiff::trace_depth() > 1;
  if (!composed && distributed && reduction == Reduction::mean) {
    // The mean over rows split across ranks, as cross_entropy takes it: the summed loss over
    // the count of targets not ignored, both totals over all ranks.
    Array total = linear_cross_entropy(hidden, weight, labels, ignore_index, label_smoothing, Reduction::sum,
                                       chunk_logits, bias);
    return target_mean(total, labels, ignore_index);
  }
  if (composed) {
    Array logits = matmul(hidden, weight, false, true);
    if (bias.defined()) logits = add(logits, bias);
    return cross_entropy(logits, labels, ignore_index, label_smoothing, reduction);
  }
  auto primitive = std::make_shared<LinearCrossEntropyPrimitive>(
      ignore_index, label_smoothing, reduction, chunk_logits, autodiff::should_record({&hidden}),
      autodiff::should_record({&weight}), bias.defined() && autodiff::should_record({&bias}));
  if (bias.defined()) return prim::apply(primitive, {hidden, weight, labels, bias});
  return prim::apply(primitive, {hidden, weight, labels});
}

int64_t vocab_pad_multiple(bool gpu) { return (gpu ? g_gpu_pad : g_cpu_pad).load(std::memory_order_relaxed); }

void set_vocab_pad_multiple(bool gpu, int64_t multiple) {
  MT_CHECK(multiple >= 1, "[linear_cross_entropy] the vocabulary's pad multiple must be >= 1, got ", multiple);
  (gpu ? g_gpu_pad : g_cpu_pad).store(multiple, std::memory_order_relaxed);
}

}  // namespace mt
