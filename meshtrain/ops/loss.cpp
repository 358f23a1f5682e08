#include "meshtrain/ops/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/cpu/loss_kernels.h"
#include "meshtrain/core/error.h"
#include "meshtrain/dist/rules.h"
#include "meshtrain/dist/spmd.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt {

using Grads = std::vector<Array>;

namespace {

struct CeShape {
  int64_t classes = 0;
  int64_t rows = 0;
  int64_t count = 0;  // targets not equal to ignore_index
};

// Validates shapes, dtypes, smoothing and every label; counts the non-ignored targets.
CeShape check_cross_entropy(const Array& logits, const Array& labels, int64_t ignore_index, double smoothing,
                            const char* op) {
  MT_CHECK(logits.defined() && labels.defined(), "[", op, "] undefined logits or labels array");
  MT_CHECK(is_floating(logits.dtype()), "[", op, "] logits must be floating, got ", logits.str());
  MT_CHECK(logits.ndim() >= 1, "[", op, "] logits must have a class axis, got ", logits.str());
  MT_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64, "[", op, "] labels must be i32 or i64, got ",
           labels.str());
  std::vector<int64_t> lead(logits.shape().dims().begin(), logits.shape().dims().end() - 1);
  MT_CHECK(labels.shape() == Shape(lead), "[", op, "] labels ", labels.str(), " must have shape ", Shape(lead).str(),
           " for logits ", logits.str(), " (classes on the last axis)");
  MT_CHECK(smoothing >= 0.0 && smoothing <= 1.0, "[", op, "] label_smoothing ", smoothing, " outside [0, 1]");
  CeShape s;
  s.classes = logits.shape()[logits.ndim() - 1];
  MT_CHECK(s.classes > 0, "[", op, "] logits ", logits.str(), " have no classes");
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
  return ne(labels, Array::full(Shape{}, double(ignore_index), labels.dtype()));
}

// The fused rule's gradient written with ops, so that it can itself be differentiated.
Array composed_grad(const Array& logits, const Array& labels, const Array& g, int64_t ignore_index, double smoothing,
                    Reduction reduction, int64_t classes, int64_t count) {
  Array x = cast(logits, DType::f32);
  Array p = exp(sub(x, logsumexp(x, {-1}, true)));
  Array valid = ignore_mask(labels, ignore_index);
  Array safe = where(valid, labels, zeros_like(labels));
  Array q = add(mul(one_hot(safe, classes, DType::f32), 1.0 - smoothing), smoothing / double(classes));
  Array gf = cast(g, DType::f32);
  // With every target ignored the mask zeroes the gradient; avoid 0 · inf = NaN.
  if (reduction == Reduction::mean) gf = div(gf, double(std::max<int64_t>(count, 1)));
  Array scale = mul(cast(valid, DType::f32), gf);  // labels.shape
  return cast(mul(sub(p, q), expand_dims(scale, -1)), logits.dtype());
}

// Per-row multipliers of the fused backward from the output cotangent.
Array row_scales(const Array& g, Reduction reduction, int64_t rows, int64_t count) {
  Array gf = cast(g, DType::f32);
  if (reduction == Reduction::none) return gf.view_as_shape(Shape{rows});
  double v = gf.item();
  if (reduction == Reduction::mean) v /= double(std::max<int64_t>(count, 1));
  return Array::full(Shape{rows}, v, DType::f32);
}

}  // namespace

namespace {

// Cross-entropy with the classes split over mesh axes, without gathering the logits. Each
// rank computes, for its slice of classes and shifted by the global row max (a constant):
// Σ exp(z), the target's z when the label falls in its slice, and Σ z. These are partial
// sums over the class axes; the loss combines their totals:
//   loss = log Σ exp(z) − (1 − ε) z_target − ε mean_c z   (the max cancels).
Array vocab_parallel_cross_entropy(const Array& logits, const Array& labels, int64_t ignore_index, double smoothing,
                                   Reduction reduction) {
  const dist::Sharding& ls = *dist::sharding_of(logits);
  const int last = logits.ndim() - 1;
  const int64_t classes = logits.dim(-1);
  const int64_t offset = ls.block_index(last) * (classes / ls.num_blocks(last));
  const std::vector<std::string> class_axes = ls.spec.axes_of(last);
  Array stats = dist::spmd_call(
      "cross_entropy", {logits, labels}, dist::rules::vocab_parallel_statistics(),
      [&](const std::vector<Array>& l, const dist::Sharding& out) {
        Array x = cast(l[0], DType::f32);
        Array row_max;
        {
          autodiff::NoGradGuard no_grad;
          row_max = max(x.detach(), {-1}, true);
          for (const std::string& axis : class_axes)
            out.mesh.axis_comm(axis).all_reduce(row_max.raw(), row_max.numel(), DType::f32, dist::ReduceOp::max);
        }
        Array z = sub(x, row_max);
        Array shifted = sub(l[1], Array::scalar(double(offset), l[1].dtype()));
        Array in_slice = logical_and(ge(shifted, zeros_like(shifted)),
                                     lt(shifted, Array::scalar(double(x.dim(-1)), l[1].dtype())));
        Array safe = where(in_slice, shifted, zeros_like(shifted));
        Array target = mul(squeeze(take_along_axis(z, expand_dims(safe, -1), -1), -1), cast(in_slice, DType::f32));
        return stack({sum(exp(z), {-1}), target, sum(z, {-1})}, -1);
      });
  const int64_t k = stats.ndim() - 1;
  auto stat = [&](int64_t i) { return squeeze(slice(stats, int(k), i, i + 1), int(k)); };
  Array per = sub(log(stat(0)), stat(1));
  if (smoothing > 0.0)
    per = add(mul(per, 1.0 - smoothing), mul(sub(log(stat(0)), div(stat(2), double(classes))), smoothing));
  Array valid = ne(labels, Array::scalar(double(ignore_index), labels.dtype()));
  per = where(valid, per, zeros_like(per));
  if (reduction == Reduction::none) return per;
  Array total = sum(per);
  if (reduction == Reduction::sum) return total;
  return div(total, sum(cast(valid, DType::f32)));
}

}  // namespace

Array cross_entropy(const Array& logits, const Array& labels, int64_t ignore_index, double label_smoothing,
                    Reduction reduction) {
  if (dist::is_sharded(logits) && !dist::sharding_of(logits)->spec.axes_of(logits.ndim() - 1).empty()) {
    MT_CHECK(labels.defined() && labels.ndim() == logits.ndim() - 1, "[cross_entropy] logits ", logits.str(),
             " and labels ", labels.str(), " do not match");
    return vocab_parallel_cross_entropy(logits, labels, ignore_index, label_smoothing, reduction);
  }
  if (dist::any_sharded({logits, labels})) {
    MT_CHECK(logits.defined() && labels.defined() && logits.ndim() >= 1 && labels.ndim() == logits.ndim() - 1,
             "[cross_entropy] logits ", logits.str(), " and labels ", labels.str(), " do not match");
    if (reduction == Reduction::mean) {
      // The mean over a batch split across ranks: the summed loss over the count of the
      // targets that are not ignored, both totals over all ranks.
      Array total = cross_entropy(logits, labels, ignore_index, label_smoothing, Reduction::sum);
      Array count = sum(cast(ne(labels, Array::scalar(double(ignore_index), labels.dtype())), DType::f32));
      return div(total, count);
    }
    return dist::spmd_call("cross_entropy", {logits, labels}, dist::rules::cross_entropy(reduction == Reduction::sum),
                           [&](const std::vector<Array>& l) {
                             return cross_entropy(l[0], l[1], ignore_index, label_smoothing, reduction);
                           });
  }
  const CeShape s = check_cross_entropy(logits, labels, ignore_index, label_smoothing, "cross_entropy");
  Array rows = Array::empty(Shape{s.rows}, DType::f32);
  Array lse = Array::empty(Shape{s.rows}, DType::f32);
  cpu::cross_entropy_forward(logits, labels, ignore_index, float(label_smoothing), rows, lse);
  Array out;
  if (reduction == Reduction::none) {
    out = rows.view_as_shape(labels.shape());
  } else {
    double total = 0.0;
    const float* pr = rows.data<float>();
    for (int64_t i = 0; i < s.rows; ++i) total += double(pr[i]);
    if (reduction == Reduction::mean)
      total = s.count > 0 ? total / double(s.count) : std::numeric_limits<double>::quiet_NaN();
    out = Array::scalar(total, DType::f32);
  }
  autodiff::record(
      out, "cross_entropy", {logits},
      [logits, labels, lse, ignore_index, label_smoothing, reduction, s](const Array& g) {
        // Under nested differentiation the backward pass must itself be recorded.
        if (autodiff::grad_enabled())
          return Grads{composed_grad(logits, labels, g, ignore_index, label_smoothing, reduction, s.classes, s.count)};
        Array scale = row_scales(g, reduction, s.rows, s.count);
        Array grad = Array::empty(logits.shape(), logits.dtype());
        cpu::cross_entropy_backward(logits, labels, lse, scale, ignore_index, float(label_smoothing), grad);
        return Grads{grad};
      });
  return out;
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
  MT_CHECK(is_floating(pred.dtype()), "[mse_loss] pred must be floating, got ", pred.str());
  MT_CHECK(pred.dtype() == target.dtype() && pred.shape() == target.shape(), "[mse_loss] pred ", pred.str(),
           " and target ", target.str(), " must have the same shape and dtype");
  Array sq = square(sub(pred, target));
  if (reduction == Reduction::none) return sq;
  return reduction == Reduction::sum ? sum(sq) : mean(sq);
}

}  // namespace mt
