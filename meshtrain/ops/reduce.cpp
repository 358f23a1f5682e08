#include "meshtrain/ops/reduce.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/elementwise.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/backend/reduce.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("reduce", {"sum", "max", "min", "argmax"});

using layout::ArgInfo;
using layout::MeshShape;
using layout::RuleResult;
using prim::OutputInfo;
using prim::Saved;
using Grads = std::vector<Array>;
using Inputs = std::vector<Array>;

std::vector<int> normalize_axes(const Shape& shape, std::vector<int> axes, const char* op) {
  if (axes.empty()) {
    for (int i = 0; i < shape.ndim(); ++i) axes.push_back(i);
    return axes;
  }
  for (int& a : axes) a = shape.axis(a, op);
  std::sort(axes.begin(), axes.end());
  MT_CHECK(std::adjacent_find(axes.begin(), axes.end()) == axes.end(), "[", op, "] repeated axis for shape ",
           shape.str());
  return axes;
}

namespace {

Shape kept_shape(const Shape& s, const std::vector<int>& axes) {
  std::vector<int64_t> dims = s.dims();
  for (int a : axes) dims[size_t(a)] = 1;
  return Shape(dims);
}

Shape reduced_shape(const Shape& s, const std::vector<int>& axes, bool keepdims) {
  if (keepdims) return kept_shape(s, axes);
  std::vector<int64_t> dims;
  for (int i = 0; i < s.ndim(); ++i)
    if (!std::binary_search(axes.begin(), axes.end(), i)) dims.push_back(s[i]);
  return Shape(dims);
}

// Runs a (outer, R, inner) kernel over arbitrary axes: contiguous axis runs reduce in
// place; scattered axes are first moved to the end by one transpose.
template <class Kernel>
Array reduce_via(const Array& x, const std::vector<int>& axes, bool keepdims, DType out_dtype, Kernel&& kernel) {
  Shape out_shape = reduced_shape(x.shape(), axes, keepdims);
  Array out = Array::empty(out_shape, out_dtype);
  if (axes.empty()) {
    kernel(x, out, x.numel(), 1, 1);
    return out;
  }
  bool contiguous = axes.back() - axes.front() + 1 == int(axes.size());
  Array src = x;
  int lo = axes.front(), hi = axes.back();
  if (!contiguous) {
    std::vector<int> perm;
    for (int i = 0; i < x.ndim(); ++i)
      if (!std::binary_search(axes.begin(), axes.end(), i)) perm.push_back(i);
    for (int a : axes) perm.push_back(a);
    autodiff::NoGradGuard no_grad;
    src = transpose(x.detach(), perm);
    lo = x.ndim() - int(axes.size());
    hi = x.ndim() - 1;
  }
  int64_t outer = 1, r = 1, inner = 1;
  for (int i = 0; i < src.ndim(); ++i) {
    if (i < lo) outer *= src.shape()[i];
    else if (i <= hi) r *= src.shape()[i];
    else inner *= src.shape()[i];
  }
  kernel(src, out, outer, r, inner);
  return out;
}

}  // namespace

namespace {

class SumPrimitive final : public prim::Primitive {
 public:
  SumPrimitive(std::vector<int> axes, bool keepdims) : axes_(std::move(axes)), keepdims_(keepdims) {}
  const char* name() const override { return "sum"; }
  // Integers and bools sum in i64, as torch.sum does.
  OutputInfo infer(const Inputs& in) const override {
    const DType dt = in[0].dtype();
    return {reduced_shape(in[0].shape(), axes_, keepdims_),
            dt == DType::boolean || dt == DType::i32 ? DType::i64 : dt};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    Array src = in[0];
    if (src.dtype() != o.dtype) {
      src = Array::empty(in[0].shape(), o.dtype);
      MT_KERNEL(src, cast, in[0], src);
    }
    return reduce_via(src, axes_, keepdims_, o.dtype, [](const Array& a, Array& out, int64_t outer, int64_t r,
                                                           int64_t inner) {
      MT_KERNEL(out, reduce, kernels::ReduceOp::sum, a, out, outer, r, inner);
    });
  }
  uint32_t keeps_inputs() const override { return 0; }
  Grads vjp(const Saved& s, const Array& g) const override {
    const Shape& shape = s.shapes[0];
    return {broadcast_to(reshape(g, kept_shape(shape, axes_).dims()), shape)};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::reduce_sum(in, mesh, axes_, keepdims_);
  }

 private:
  std::vector<int> axes_;
  bool keepdims_;
};

// max / min over axes; ties share the gradient evenly.
class ExtremumPrimitive final : public prim::Primitive {
 public:
  ExtremumPrimitive(kernels::ReduceOp op, std::vector<int> axes, bool keepdims)
      : op_(op), axes_(std::move(axes)), keepdims_(keepdims) {}
  const char* name() const override { return op_ == kernels::ReduceOp::max ? "max" : "min"; }
  OutputInfo infer(const Inputs& in) const override {
    for (int a : axes_) MT_CHECK(in[0].shape()[a] > 0, "[", name(), "] reduction over empty axis of ", in[0].str());
    return {reduced_shape(in[0].shape(), axes_, keepdims_), in[0].dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const kernels::ReduceOp op = op_;
    return reduce_via(in[0], axes_, keepdims_, o.dtype, [op](const Array& a, Array& out, int64_t outer, int64_t r,
                                                              int64_t inner) { MT_KERNEL(out, reduce, op, a, out, outer, r, inner); });
  }
  bool keeps_output() const override { return true; }
  Grads vjp(const Saved& s, const Array& g) const override {
    const Array& x = s.inputs[0];
    Shape ks = kept_shape(x.shape(), axes_);
    Array hit = cast(eq(x, reshape(s.output, ks.dims())), x.dtype());
    Array count = sum(hit, axes_, true);
    return {div(mul(hit, reshape(g, ks.dims())), count)};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::reduce_gathered(in, mesh, axes_, keepdims_);
  }

 private:
  kernels::ReduceOp op_;
  std::vector<int> axes_;
  bool keepdims_;
};

class ArgmaxPrimitive final : public prim::Primitive {
 public:
  ArgmaxPrimitive(int axis, bool keepdims) : axis_(axis), keepdims_(keepdims) {}
  const char* name() const override { return "argmax"; }
  OutputInfo infer(const Inputs& in) const override {
    MT_CHECK(in[0].shape()[axis_] > 0, "[argmax] empty axis of ", in[0].str());
    return {reduced_shape(in[0].shape(), {axis_}, keepdims_), DType::i64};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    return reduce_via(in[0], {axis_}, keepdims_, DType::i64, [](const Array& a, Array& out, int64_t outer,
                                                                 int64_t r, int64_t inner) {
      MT_KERNEL(out, argmax, a, out, outer, r, inner);
    });
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::reduce_gathered(in, mesh, {axis_}, keepdims_);
  }

 private:
  int axis_;
  bool keepdims_;
};

}  // namespace

Array sum(const Array& x, std::vector<int> axes, bool keepdims) {
  MT_CHECK(x.defined(), "[sum] undefined input array");
  axes = normalize_axes(x.shape(), axes, "sum");
  return prim::apply(std::make_shared<SumPrimitive>(std::move(axes), keepdims), {x});
}

Array mean(const Array& x, std::vector<int> axes, bool keepdims) {
  MT_CHECK(x.defined() && is_floating(x.dtype()), "[mean] expects a floating array, got ", x.str());
  axes = normalize_axes(x.shape(), axes, "mean");
  int64_t count = 1;
  for (int a : axes) count *= x.shape()[a];
  return div(sum(x, axes, keepdims), double(count));
}

namespace {
Array extremum(const Array& x, std::vector<int> axes, bool keepdims, kernels::ReduceOp op, const char* name) {
  MT_CHECK(x.defined(), "[", name, "] undefined input array");
  axes = normalize_axes(x.shape(), axes, name);
  return prim::apply(std::make_shared<ExtremumPrimitive>(op, std::move(axes), keepdims), {x});
}
}  // namespace

Array max(const Array& x, std::vector<int> axes, bool keepdims) {
  return extremum(x, std::move(axes), keepdims, kernels::ReduceOp::max, "max");
}
Array min(const Array& x, std::vector<int> axes, bool keepdims) {
  return extremum(x, std::move(axes), keepdims, kernels::ReduceOp::min, "min");
}

Array logsumexp(const Array& x, std::vector<int> axes, bool keepdims) {
  MT_CHECK(x.defined() && is_floating(x.dtype()), "[logsumexp] expects a floating array, got ", x.str());
  axes = normalize_axes(x.shape(), axes, "logsumexp");
  // Shifting by the (constant) max keeps exp in range; the gradient does not depend on it.
  Array m = max(x, axes, true).detach();
  m = where(eq(m, m), m, zeros_like(m));  // all-NaN rows
  Array inf_mask = eq(abs(m), scalar_like(m, INFINITY));
  m = where(inf_mask, zeros_like(m), m);
  Array out = add(log(sum(exp(sub(x, m)), axes, true)), m);
  if (!keepdims) out = reshape(out, reduced_shape(x.shape(), axes, false).dims());
  return out;
}

Array argmax(const Array& x, int axis, bool keepdims) {
  MT_CHECK(x.defined(), "[argmax] undefined input array");
  std::vector<int> axes = normalize_axes(x.shape(), {axis}, "argmax");
  return prim::apply(std::make_shared<ArgmaxPrimitive>(axes[0], keepdims), {x});
}

}  // namespace mt
