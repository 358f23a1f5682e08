#include "meshtrain/ops/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/loss.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/index_checks.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("loss", {"cross_entropy", "vocab_parallel_statistics", "vocab_parallel_slice_max"});

using layout::ArgInfo;
using layout::MeshShape;
using layout::RuleResult;
using prim::OutputInfo;
using prim::Saved;
using Grads = std::vector<Array>;
using Inputs = std::vector<Array>;

namespace {

struct CeShape {
  int64_t classes = 0;
  int64_t rows = 0;
  int64_t count = 0;  // targets not equal to ignore_index
};

// Validates shapes, dtypes and smoothing (no data is read: the arrays may be distributed).
void check_cross_entropy_shapes(const Array& logits, const Array& labels, double smoothing, const char* op) {
  MT_CHECK(logits.defined() && labels.defined(), "[", op, "] undefined logits or labels array");
  MT_CHECK(is_floating(logits.dtype()), "[", op, "] logits must be floating, got ", logits.str());
  MT_CHECK(logits.ndim() >= 1, "[", op, "] logits must have a class axis, got ", logits.str());
  MT_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64, "[", op, "] labels must be i32 or i64, got ",
           labels.str());
  std::vector<int64_t> lead(logits.shape().dims().begin(), logits.shape().dims().end() - 1);
  MT_CHECK(labels.shape() == Shape(lead), "[", op, "] labels ", labels.str(), " must have shape ", Shape(lead).str(),
           " for logits ", logits.str(), " (classes on the last axis)");
  MT_CHECK(smoothing >= 0.0 && smoothing <= 1.0, "[", op, "] label_smoothing ", smoothing, " outside [0, 1]");
  MT_CHECK(logits.shape()[logits.ndim() - 1] > 0, "[", op, "] logits ", logits.str(), " have no classes");
}

// Checks every label of plain arrays; counts the non-ignored targets.
CeShape check_cross_entropy(const Array& logits, const Array& labels, int64_t ignore_index, double smoothing,
                            const char* op) {
  check_cross_entropy_shapes(logits, labels, smoothing, op);
  CeShape s;
  s.classes = logits.shape()[logits.ndim() - 1];
  s.rows = labels.numel();
  std::vector<int64_t> ys = labels.to_ints();
  for (size_t j = 0; j < ys.size(); ++j) {
    if (ys[j] == ignore_index) continue;
    MT_CHECK(ys[j] >= 0 && ys[j] < s.classes, "[", op, "] label ", ys[j], " out of range for ", s.classes,
             " classes at flat position ", j, " (logits ", logits.str(), ", labels ", labels.str(), ", ignore_index ",
             ignore_index, ")");
    ++s.count;
  }
  return s;
}

Array ignore_mask(const Array& labels, int64_t ignore_index) {
  return ne(labels, Array::full(Shape{}, double(ignore_index), labels.dtype(), labels.device()));
}

// g / max(count, 1) on the device: the mean's divisor, with every target ignored giving a zero
// gradient rather than 0 · inf = NaN. count is the forward's i64 scalar.
Array per_target(const Array& gf, const Array& count) {
  Array c = cast(count, DType::f32);
  return div(gf, maximum(c, scalar_like(c, 1.0)));
}

// The fused rule's gradient written with ops, so that it can itself be differentiated.
Array composed_grad(const Array& logits, const Array& labels, const Array& g, int64_t ignore_index, double smoothing,
                    Reduction reduction, int64_t classes, const Array& count) {
  Array x = cast(logits, DType::f32);
  Array p = exp(sub(x, logsumexp(x, {-1}, true)));
  Array valid = ignore_mask(labels, ignore_index);
  Array safe = where(valid, labels, zeros_like(labels));
  Array q = add(mul(one_hot(safe, classes, DType::f32), 1.0 - smoothing), smoothing / double(classes));
  Array gf = cast(g, DType::f32);
  if (reduction == Reduction::mean) gf = per_target(gf, count);
  Array scale = mul(cast(valid, DType::f32), gf);  // labels.shape
  return cast(mul(sub(p, q), expand_dims(scale, -1)), logits.dtype());
}

// Per-row multipliers of the fused backward from the output cotangent, on the device (no
// read of the cotangent or the count to the host).
Array row_scales(const Array& g, Reduction reduction, int64_t rows, const Array& count) {
  Array gf = cast(g, DType::f32);
  if (reduction == Reduction::none) return gf.view_as_shape(Shape{rows});
  if (reduction == Reduction::mean) gf = per_target(gf, count);
  return broadcast_to(gf, Shape{rows});  // a (rows,) array, as the kernel reads it
}

// Fused cross-entropy: one pass computes each row's loss and log-sum-exp; the backward
// pass is one more from the saved log-sum-exp. Inputs (logits (..., C), labels (...)).
class CrossEntropyPrimitive final : public prim::Primitive {
 public:
  CrossEntropyPrimitive(int64_t ignore_index, double smoothing, Reduction reduction)
      : ignore_index_(ignore_index), smoothing_(smoothing), reduction_(reduction) {}
  const char* name() const override { return "cross_entropy"; }
  OutputInfo infer(const Inputs& in) const override {
    check_cross_entropy_shapes(in[0], in[1], smoothing_, "cross_entropy");
    return {reduction_ == Reduction::none ? in[1].shape() : Shape{}, DType::f32};
  }
  Array run(const Inputs& in, const OutputInfo&, Inputs& aux) const override {
    const Array& logits = in[0];
    const int64_t n = in[1].numel(), classes = logits.dim(-1);
    // Validated on the device (read at once, or with the step's loss inside a Trainer step),
    // and the targets counted there: no host read mid-step.
    const Array labels = checked_indices(
        in[1], classes, "cross_entropy",
        // Shapes kept, formatted only on failure (this runs on every cross-entropy call).
        [classes, ignore = ignore_index_, ld = logits.dtype(), ls = logits.shape(), yd = in[1].dtype(),
         ys = in[1].shape()](int64_t position, int64_t value) {
          return detail::concat("[cross_entropy] label ", value, " out of range for ", classes,
                                " classes at flat position ", position, " (logits ", dtype_name(ld), ls.str(),
                                ", labels ", dtype_name(yd), ys.str(), ", ignore_index ", ignore, ")");
        },
        ignore_index_);
    Array count = Array::empty(Shape{}, DType::i64, labels.device());
    MT_KERNEL(labels, cross_entropy_count, labels, ignore_index_, count);
    Array rows = Array::empty(Shape{n}, DType::f32);
    Array lse = Array::empty(Shape{n}, DType::f32);
    MT_KERNEL(logits, cross_entropy_forward, logits, labels, classes, ignore_index_, float(smoothing_), rows, lse);
    // The checked labels: inside a deferred scope the backward reads the same in-bounds copy.
    aux = {lse, count, labels};
    if (reduction_ == Reduction::none) return rows.view_as_shape(labels.shape());
    Array total = Array::empty(Shape{}, DType::f32);
    MT_KERNEL(rows, cross_entropy_total, rows, count, reduction_ == Reduction::mean, total);
    return total;
  }
  Grads vjp(const Saved& s, const Array& g) const override {
    const Array &logits = s.inputs[0], &labels = s.aux[2];
    const int64_t classes = logits.dim(-1), rows = labels.numel();
    const Array& count = s.aux[1];
    // Under nested differentiation the backward pass must itself be recorded.
    if (autodiff::grad_enabled())
      return {composed_grad(logits, labels, g, ignore_index_, smoothing_, reduction_, classes, count), Array()};
    Array scale = row_scales(g, reduction_, rows, count);
    Array grad = Array::empty(logits.shape(), logits.dtype(), logits.device());
    MT_KERNEL(logits, cross_entropy_backward, logits, labels, classes, s.aux[0], scale, ignore_index_, float(smoothing_),
              grad);
    return {grad, Array()};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::cross_entropy(in, mesh, reduction_ == Reduction::sum);
  }

 private:
  int64_t ignore_index_;
  double smoothing_;
  Reduction reduction_;
};

// Vocabulary-parallel cross-entropy's per-row statistics on one rank's slice of classes
// [offset, offset + C_local), shifted by the global row max M (a constant): Σ exp(z), the
// target's z when the label falls in the slice (else 0), and Σ z, with z = x − M.
// Inputs (logits (..., C), labels (...), M (..., 1)); output (..., 3) f32, partial over the
// class axes.
class VocabStatisticsPrimitive final : public prim::Primitive {
 public:
  explicit VocabStatisticsPrimitive(int64_t offset = 0) : offset_(offset) {}
  const char* name() const override { return "vocab_parallel_statistics"; }
  OutputInfo infer(const Inputs& in) const override {
    std::vector<int64_t> dims = in[1].shape().dims();
    dims.push_back(3);
    return {Shape(dims), DType::f32};
  }
  Array run(const Inputs& in, const OutputInfo&, Inputs&) const override {
    autodiff::NoGradGuard no_grad;
    Array z = sub(cast(in[0], DType::f32), in[2]);
    auto [in_slice, safe] = local_targets(in[1], z.dim(-1));
    Array target = mul(squeeze(take_along_axis(z, expand_dims(safe, -1), -1), -1), cast(in_slice, DType::f32));
    return stack({sum(exp(z), {-1}), target, sum(z, {-1})}, -1);
  }
  // d/dx: g0 · exp(z) + g1 · [class == label] + g2.
  Grads vjp(const Saved& s, const Array& g) const override {
    const Array& logits = s.inputs[0];
    Array z = sub(cast(logits, DType::f32), s.inputs[2]);
    auto [in_slice, safe] = local_targets(s.inputs[1], z.dim(-1));
    Array hit = mul(one_hot(safe, z.dim(-1), DType::f32), expand_dims(cast(in_slice, DType::f32), -1));
    auto part = [&](int64_t i) { return slice(g, -1, i, i + 1); };
    Array dx = add(add(mul(part(0), exp(z)), mul(part(1), hit)), part(2));
    return {cast(dx, logits.dtype()), Array(), Array()};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::vocab_parallel_statistics(in, mesh);
  }
  prim::PrimitivePtr localize(const prim::LocalContext& ctx, const prim::PrimitivePtr&) const override {
    return std::make_shared<VocabStatisticsPrimitive>(ctx.input_offsets[0].back());
  }

 private:
  // Whether each label falls in this slice, and its index in the slice (0 where it does not).
  std::pair<Array, Array> local_targets(const Array& labels, int64_t local_classes) const {
    Array shifted = sub(labels, Array::scalar(double(offset_), labels.dtype(), labels.device()));
    Array in_slice = logical_and(ge(shifted, zeros_like(shifted)),
                                 lt(shifted, Array::scalar(double(local_classes), labels.dtype(), labels.device())));
    return {in_slice, where(in_slice, shifted, zeros_like(shifted))};
  }
  int64_t offset_;
};

// Each row's max over one rank's slice of classes, placed in that slice's slot of a
// (..., slices) array that is zero elsewhere: a partial sum over the class axes, so one small
// all-reduce gives every rank every slice's max. Input logits (..., C), output f32.
class SliceMaxPrimitive final : public prim::Primitive {
 public:
  SliceMaxPrimitive(int64_t slices, int64_t slot = 0) : slices_(slices), slot_(slot) {}
  const char* name() const override { return "vocab_parallel_slice_max"; }
  OutputInfo infer(const Inputs& in) const override {
    std::vector<int64_t> dims = in[0].shape().dims();
    dims.back() = slices_;
    return {Shape(dims), DType::f32};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    autodiff::NoGradGuard no_grad;
    Array m = cast(max(in[0], {-1}, true), DType::f32);
    std::vector<int64_t> dims = o.shape.dims();
    dims.back() = slices_;
    return pad_into(m, Shape(dims), -1, slot_);
  }
  bool differentiable(const Inputs&, const OutputInfo&) const override { return false; }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape&) const override {
    const int n = in[0].shape.ndim();
    layout::PartitionSpec logits = in[0].spec.without_partial().padded(n);
    layout::PartitionSpec out = logits;
    out.dims.back().clear();
    return {{logits}, out.with_partial(logits.dims.back())};
  }
  // The local output keeps every slot (the output's class dim is whole).
  prim::PrimitivePtr localize(const prim::LocalContext& ctx, const prim::PrimitivePtr&) const override {
    const int64_t local_classes = ctx.input_global[0].dims().back() / slices_;
    return std::make_shared<SliceMaxPrimitive>(slices_, ctx.input_offsets[0].back() / local_classes);
  }

 private:
  int64_t slices_, slot_;
};

// Cross-entropy with the classes split over mesh axes, without gathering the logits. The row
// max comes from each slice's max (one small all-reduce); the statistics are partial sums over
// the class axes, and the loss combines their totals:
//   loss = log Σ exp(z) − (1 − ε) z_target − ε mean_c z   (the max cancels).
Array vocab_parallel_cross_entropy(const Array& logits, const Array& labels, int64_t ignore_index, double smoothing,
                                   Reduction reduction) {
  const int last = logits.ndim() - 1;
  const int64_t classes = logits.dim(-1);
  const int64_t slices = prim::mesh_shape_of(logits).blocks(prim::spec_of(logits).axes_of(last));
  Array row_max;
  {
    autodiff::NoGradGuard no_grad;
    row_max = max(prim::apply(std::make_shared<SliceMaxPrimitive>(slices), {logits.detach()}), {-1}, true);
  }
  Array stats = prim::apply(std::make_shared<VocabStatisticsPrimitive>(), {logits, labels, row_max});
  const int64_t k = stats.ndim() - 1;
  auto stat = [&](int64_t i) { return squeeze(slice(stats, int(k), i, i + 1), int(k)); };
  Array per = sub(log(stat(0)), stat(1));
  if (smoothing > 0.0)
    per = add(mul(per, 1.0 - smoothing), mul(sub(log(stat(0)), div(stat(2), double(classes))), smoothing));
  Array valid = ne(labels, Array::scalar(double(ignore_index), labels.dtype(), labels.device()));
  per = where(valid, per, zeros_like(per));
  if (reduction == Reduction::none) return per;
  Array total = sum(per);
  if (reduction == Reduction::sum) return total;
  return target_mean(total, labels, ignore_index);
}

}  // namespace

Array cross_entropy(const Array& logits, const Array& labels, int64_t ignore_index, double label_smoothing,
                    Reduction reduction) {
  check_cross_entropy_shapes(logits, labels, label_smoothing, "cross_entropy");
  if (logits.distributed() && !prim::spec_of(logits).axes_of(logits.ndim() - 1).empty())
    return vocab_parallel_cross_entropy(logits, labels, ignore_index, label_smoothing, reduction);
  if (reduction == Reduction::mean && (logits.distributed() || labels.distributed())) {
    // The mean over a batch split across ranks: the summed loss over the count of the
    // targets that are not ignored, both totals over all ranks.
    Array total = cross_entropy(logits, labels, ignore_index, label_smoothing, Reduction::sum);
    return target_mean(total, labels, ignore_index);
  }
  return prim::apply(std::make_shared<CrossEntropyPrimitive>(ignore_index, label_smoothing, reduction),
                     {logits, labels});
}

Array target_mean(const Array& total, const Array& labels, int64_t ignore_index) {
  Array count = sum(cast(ignore_mask(labels, ignore_index), total.dtype()));
  // Divided by max(count, 1), so that when every target is ignored the gradient is 0·1 = 0
  // (as one device's op gives) and not 0·∞ = NaN; the value is then made NaN, as torch's,
  // by adding an untraced NaN, which passes the gradient through unchanged.
  Array mean = div(total, maximum(count, scalar_like(count, 1.0)));
  Array empty = eq(count, scalar_like(count, 0.0));
  return add(mean, where(empty, scalar_like(count, std::numeric_limits<double>::quiet_NaN()), scalar_like(count, 0.0)));
}

Array cross_entropy_reference(const Array& logits, const Array& labels, int64_t ignore_index, double label_smoothing,
                              Reduction reduction) {
  const CeShape s = check_cross_entropy(logits, labels, ignore_index, label_smoothing, "cross_entropy_reference");
  Array x = cast(logits, DType::f32);
  Array logp = sub(x, logsumexp(x, {-1}, true));
  Array valid = ignore_mask(labels, ignore_index);
  Array safe = where(valid, labels, zeros_like(labels));
  Array per = neg(squeeze(take_along_axis(logp, expand_dims(safe, -1), -1), -1));
  if (label_smoothing > 0.0) per = add(mul(per, 1.0 - label_smoothing), mul(neg(mean(logp, {-1})), label_smoothing));
  per = where(valid, per, zeros_like(per));
  if (reduction == Reduction::none) return per;
  Array total = sum(per);
  if (reduction == Reduction::sum) return total;
  return div(total, s.count > 0 ? double(s.count) : std::numeric_limits<double>::quiet_NaN());
}

Array mse_loss(const Array& pred, const Array& target, Reduction reduction) {
  MT_CHECK(pred.defined() && target.defined(), "[mse_loss] undefined pred or target array");
  MT_CHECK(is_floating(pred.dtype()) && is_floating(target.dtype()), "[mse_loss] pred and target must be floating, got ",
           pred.str(), " and ", target.str());
  MT_CHECK(pred.shape() == target.shape(), "[mse_loss] pred ", pred.str(), " and target ", target.str(),
           " must have the same shape");
  // A loss computes in f32, as under torch.autocast: a bf16 model's predictions meet f32
  // targets here.
  Array sq = square(sub(cast(pred, DType::f32), cast(target, DType::f32)));
  if (reduction == Reduction::none) return sq;
  return reduction == Reduction::sum ? sum(sq) : mean(sq);
}

}  // namespace mt
