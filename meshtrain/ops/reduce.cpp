#include "meshtrain/ops/reduce.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/autodiff/value_and_grad.h"
#include "meshtrain/backend/cpu/reduce.h"
#include "meshtrain/core/error.h"
#include "meshtrain/dist/rules.h"
#include "meshtrain/dist/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt {

using autodiff::record;
using Grads = std::vector<Array>;

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

Array sum(const Array& x, std::vector<int> axes, bool keepdims) {
  MT_CHECK(x.defined(), "[sum] undefined input array");
  axes = normalize_axes(x.shape(), axes, "sum");
  if (dist::is_sharded(x))
    return dist::spmd_call("sum", {x}, dist::rules::reduce_sum(axes, keepdims),
                           [&](const std::vector<Array>& l) { return sum(l[0], axes, keepdims); });
  DType dt = x.dtype() == DType::boolean || x.dtype() == DType::i32 ? DType::i64 : x.dtype();
  Array src = dt == x.dtype() ? x : cast(x, dt);
  Array out = reduce_via(src, axes, keepdims, dt, [](const Array& a, Array& o, int64_t outer, int64_t r, int64_t in) {
    cpu::reduce(cpu::ReduceOp::sum, a, o, outer, r, in);
  });
  if (is_floating(dt))
    record(out, "sum", {x}, [s = x.shape(), axes](const Array& g) {
      return Grads{broadcast_to(reshape(g, kept_shape(s, axes).dims()), s)};
    });
  return out;
}

Array mean(const Array& x, std::vector<int> axes, bool keepdims) {
  MT_CHECK(x.defined() && is_floating(x.dtype()), "[mean] expects a floating array, got ", x.str());
  axes = normalize_axes(x.shape(), axes, "mean");
  int64_t count = 1;
  for (int a : axes) count *= x.shape()[a];
  return div(sum(x, axes, keepdims), double(count));
}

namespace {
Array extremum(const Array& x, std::vector<int> axes, bool keepdims, cpu::ReduceOp op, const char* name) {
  MT_CHECK(x.defined(), "[", name, "] undefined input array");
  axes = normalize_axes(x.shape(), axes, name);
  if (dist::is_sharded(x))
    return dist::spmd_call(name, {x}, dist::rules::reduce_gathered(axes, keepdims), [&](const std::vector<Array>& l) {
      return extremum(l[0], axes, keepdims, op, name);
    });
  for (int a : axes) MT_CHECK(x.shape()[a] > 0, "[", name, "] reduction over empty axis of ", x.str());
  Array out = reduce_via(x, axes, keepdims, x.dtype(), [op](const Array& a, Array& o, int64_t outer, int64_t r,
                                                            int64_t in) { cpu::reduce(op, a, o, outer, r, in); });
  if (is_floating(x.dtype()))
    record(out, name, {x}, [x, axes, o = out.detach()](const Array& g) {
      Shape ks = kept_shape(x.shape(), axes);
      Array hit = cast(eq(x, reshape(o, ks.dims())), x.dtype());
      Array count = sum(hit, axes, true);
      return Grads{div(mul(hit, reshape(g, ks.dims())), count)};
    });
  return out;
}
}  // namespace

Array max(const Array& x, std::vector<int> axes, bool keepdims) {
  return extremum(x, std::move(axes), keepdims, cpu::ReduceOp::max, "max");
}
Array min(const Array& x, std::vector<int> axes, bool keepdims) {
  return extremum(x, std::move(axes), keepdims, cpu::ReduceOp::min, "min");
}

Array logsumexp(const Array& x, std::vector<int> axes, bool keepdims) {
  MT_CHECK(x.defined() && is_floating(x.dtype()), "[logsumexp] expects a floating array, got ", x.str());
  axes = normalize_axes(x.shape(), axes, "logsumexp");
  // Shifting by the (constant) max keeps exp in range; the gradient does not depend on it.
  Array m = stop_gradient(max(x, axes, true));
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
  if (dist::is_sharded(x))
    return dist::spmd_call("argmax", {x}, dist::rules::reduce_gathered(axes, keepdims),
                           [&](const std::vector<Array>& l) { return argmax(l[0], axes[0], keepdims); });
  MT_CHECK(x.shape()[axes[0]] > 0, "[argmax] empty axis of ", x.str());
  return reduce_via(x, axes, keepdims, DType::i64, [](const Array& a, Array& o, int64_t outer, int64_t r, int64_t in) {
    cpu::argmax(a, o, outer, r, in);
  });
}

}  // namespace mt
