#include "meshtrain/ops/shape_ops.h"

#include <algorithm>
#include <numeric>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/cpu/strided_copy.h"
#include "meshtrain/core/error.h"
#include "meshtrain/dist/rules.h"
#include "meshtrain/dist/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/reduce.h"

namespace mt {

using autodiff::record;
using Grads = std::vector<Array>;

namespace {
bool differentiable(const Array& a) { return is_floating(a.dtype()); }
}  // namespace

Array reshape(const Array& x, std::vector<int64_t> shape) {
  MT_CHECK(x.defined(), "[reshape] undefined input array");
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MT_CHECK(infer < 0, "[reshape] more than one -1 in target shape for ", x.str());
      infer = int(i);
    } else {
      MT_CHECK(shape[i] >= 0, "[reshape] negative dimension in target shape for ", x.str());
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    MT_CHECK(known > 0 && x.numel() % known == 0, "[reshape] cannot infer -1 reshaping ", x.str());
    shape[size_t(infer)] = x.numel() / known;
  }
  Shape target(shape);
  MT_CHECK(target.numel() == x.numel(), "[reshape] cannot reshape ", x.str(), " to ", target.str());
  if (dist::is_sharded(x))
    return dist::spmd_call("reshape", {x}, dist::rules::reshape(target),
                           [&](const std::vector<Array>& l, const dist::Sharding& out) {
                             return reshape(l[0], out.local_shape(target).dims());
                           });
  Array out = x.view_as_shape(target);
  if (differentiable(out))
    record(out, "reshape", {x}, [s = x.shape()](const Array& g) { return Grads{reshape(g, s.dims())}; });
  return out;
}

Array transpose(const Array& x, std::vector<int> perm) {
  MT_CHECK(x.defined(), "[transpose] undefined input array");
  MT_CHECK(int(perm.size()) == x.ndim(), "[transpose] permutation of length ", perm.size(), " for ", x.str());
  if (dist::is_sharded(x)) {
    for (int& p : perm) p = x.shape().axis(p, "transpose");
    return dist::spmd_call("transpose", {x}, dist::rules::transpose(perm),
                           [&](const std::vector<Array>& l) { return transpose(l[0], perm); });
  }
  std::vector<bool> seen(perm.size(), false);
  for (int& p : perm) {
    p = x.shape().axis(p, "transpose");
    MT_CHECK(!seen[size_t(p)], "[transpose] repeated axis in permutation for ", x.str());
    seen[size_t(p)] = true;
  }
  std::vector<int64_t> dims(perm.size()), src_strides(perm.size());
  std::vector<int64_t> xs = x.shape().strides();
  for (size_t i = 0; i < perm.size(); ++i) {
    dims[i] = x.shape()[perm[i]];
    src_strides[i] = xs[size_t(perm[i])];
  }
  Array out = Array::empty(Shape(dims), x.dtype());
  cpu::strided_copy(x.raw(), src_strides, out.raw(), out.shape().strides(), dims, dtype_size(x.dtype()));
  if (differentiable(out))
    record(out, "transpose", {x}, [perm](const Array& g) {
      std::vector<int> inverse(perm.size());
      for (size_t i = 0; i < perm.size(); ++i) inverse[size_t(perm[i])] = int(i);
      return Grads{transpose(g, inverse)};
    });
  return out;
}

Array swap_axes(const Array& x, int a, int b) {
  MT_CHECK(x.defined(), "[swap_axes] undefined input array");
  std::vector<int> perm(size_t(x.ndim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[size_t(x.shape().axis(a, "swap_axes"))], perm[size_t(x.shape().axis(b, "swap_axes"))]);
  return transpose(x, perm);
}

Array slice(const Array& x, int axis, int64_t start, int64_t stop) {
  MT_CHECK(x.defined(), "[slice] undefined input array");
  axis = x.shape().axis(axis, "slice");
  if (dist::is_sharded(x))
    return dist::spmd_call("slice", {x}, dist::rules::gather_dims({axis}, true),
                           [&](const std::vector<Array>& l) { return slice(l[0], axis, start, stop); });
  const int64_t n = x.shape()[axis];
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  start = std::clamp<int64_t>(start, 0, n);
  stop = std::clamp<int64_t>(stop, start, n);
  std::vector<int64_t> dims = x.shape().dims();
  dims[size_t(axis)] = stop - start;
  Array out = Array::empty(Shape(dims), x.dtype());
  std::vector<int64_t> xs = x.shape().strides();
  const char* src = static_cast<const char*>(x.raw()) + size_t(start * xs[size_t(axis)]) * dtype_size(x.dtype());
  cpu::strided_copy(src, xs, out.raw(), out.shape().strides(), dims, dtype_size(x.dtype()));
  if (differentiable(out))
    record(out, "slice", {x}, [full = x.shape(), axis, start](const Array& g) {
      return Grads{pad_into(g, full, axis, start)};
    });
  return out;
}

Array pad_into(const Array& x, const Shape& full, int axis, int64_t start) {
  MT_CHECK(x.defined(), "[pad_into] undefined input array");
  MT_CHECK(x.ndim() == full.ndim(), "[pad_into] rank mismatch: ", x.str(), " into ", full.str());
  axis = full.axis(axis, "pad_into");
  if (dist::is_sharded(x))
    return dist::spmd_call("pad_into", {x}, dist::rules::gather_dims({axis}, true), [&](const std::vector<Array>& l) {
      std::vector<int64_t> dims = l[0].shape().dims();
      dims[size_t(axis)] = full[axis];
      return pad_into(l[0], Shape(dims), axis, start);
    });
  // The copy below writes raw memory: a block that does not fit must be an error, not corruption.
  bool fits = start >= 0 && start + x.shape()[axis] <= full[axis];
  for (int d = 0; d < full.ndim(); ++d) fits = fits && (d == axis || x.shape()[d] == full[d]);
  MT_CHECK(fits, "[pad_into] cannot place ", x.str(), " into ", full.str(), " at ", start, " along axis ", axis);
  Array out = Array::zeros(full, x.dtype());
  std::vector<int64_t> fs = full.strides();
  char* dst = static_cast<char*>(out.raw()) + size_t(start * fs[size_t(axis)]) * dtype_size(x.dtype());
  cpu::strided_copy(x.raw(), x.shape().strides(), dst, fs, x.shape().dims(), dtype_size(x.dtype()));
  if (differentiable(out))
    record(out, "pad_into", {x}, [axis, start, len = x.shape()[axis]](const Array& g) {
      return Grads{slice(g, axis, start, start + len)};
    });
  return out;
}

Array concatenate(const std::vector<Array>& xs, int axis) {
  MT_CHECK(!xs.empty(), "[concatenate] no arrays given");
  const Array& first = xs[0];
  MT_CHECK(first.defined(), "[concatenate] undefined input array");
  axis = first.shape().axis(axis, "concatenate");
  if (dist::any_sharded(xs))
    return dist::spmd_call("concatenate", xs, dist::rules::concatenate(axis),
                           [&](const std::vector<Array>& l) { return concatenate(l, axis); });
  std::vector<int64_t> dims = first.shape().dims();
  int64_t total = 0;
  for (const Array& x : xs) {
    MT_CHECK(x.defined(), "[concatenate] undefined input array");
    MT_CHECK(x.dtype() == first.dtype(), "[concatenate] dtype mismatch: ", first.str(), " vs ", x.str());
    MT_CHECK(x.ndim() == first.ndim(), "[concatenate] rank mismatch: ", first.str(), " vs ", x.str());
    for (int d = 0; d < x.ndim(); ++d)
      MT_CHECK(d == axis || x.shape()[d] == first.shape()[d], "[concatenate] shapes ", first.shape().str(), " and ",
               x.shape().str(), " differ outside axis ", axis);
    total += x.shape()[axis];
  }
  dims[size_t(axis)] = total;
  Array out = Array::empty(Shape(dims), first.dtype());
  std::vector<int64_t> os = out.shape().strides();
  int64_t offset = 0;
  std::vector<int64_t> sizes;
  for (const Array& x : xs) {
    char* dst = static_cast<char*>(out.raw()) + size_t(offset * os[size_t(axis)]) * dtype_size(x.dtype());
    cpu::strided_copy(x.raw(), x.shape().strides(), dst, os, x.shape().dims(), dtype_size(x.dtype()));
    offset += x.shape()[axis];
    sizes.push_back(x.shape()[axis]);
  }
  if (differentiable(out))
    record(out, "concatenate", xs, [sizes, axis](const Array& g) { return split(g, sizes, axis); });
  return out;
}

std::vector<Array> split(const Array& x, const std::vector<int64_t>& sizes, int axis) {
  MT_CHECK(x.defined(), "[split] undefined input array");
  axis = x.shape().axis(axis, "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    // slice() would read a negative size as "from the end" and return wrong pieces.
    MT_CHECK(s >= 0, "[split] negative piece size ", s, " splitting ", x.str(), " along axis ", axis);
    total += s;
  }
  MT_CHECK(total == x.shape()[axis], "[split] sizes sum to ", total, " but ", x.str(), " has ", x.shape()[axis],
           " along axis ", axis);
  std::vector<Array> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(slice(x, axis, start, start + s));
    start += s;
  }
  return out;
}

Array stack(const std::vector<Array>& xs, int axis) {
  MT_CHECK(!xs.empty(), "[stack] no arrays given");
  std::vector<Array> expanded;
  for (const Array& x : xs) {
    MT_CHECK(x.shape() == xs[0].shape(), "[stack] shapes differ: ", xs[0].str(), " vs ", x.str());
    expanded.push_back(expand_dims(x, axis));
  }
  return concatenate(expanded, axis < 0 ? axis : axis);
}

Array expand_dims(const Array& x, int axis) {
  MT_CHECK(x.defined(), "[expand_dims] undefined input array");
  int n = x.ndim() + 1;
  MT_CHECK(axis >= -n && axis < n, "[expand_dims] axis ", axis, " out of range for ", x.str());
  if (axis < 0) axis += n;
  std::vector<int64_t> dims = x.shape().dims();
  dims.insert(dims.begin() + axis, 1);
  return reshape(x, dims);
}

Array squeeze(const Array& x, int axis) {
  MT_CHECK(x.defined(), "[squeeze] undefined input array");
  axis = x.shape().axis(axis, "squeeze");
  MT_CHECK(x.shape()[axis] == 1, "[squeeze] axis ", axis, " of ", x.str(), " is not 1");
  std::vector<int64_t> dims = x.shape().dims();
  dims.erase(dims.begin() + axis);
  return reshape(x, dims);
}

Array broadcast_to(const Array& x, const Shape& shape) {
  MT_CHECK(x.defined(), "[broadcast_to] undefined input array");
  if (x.shape() == shape) return x;
  Shape b = broadcast_shapes(x.shape(), shape, "broadcast_to");
  MT_CHECK(b == shape, "[broadcast_to] cannot broadcast ", x.str(), " to ", shape.str());
  if (dist::is_sharded(x))
    return dist::spmd_call("broadcast_to", {x}, dist::rules::broadcast_to(shape),
                           [&](const std::vector<Array>& l, const dist::Sharding& out) {
                             return broadcast_to(l[0], out.local_shape(shape));
                           });
  const int n = shape.ndim();
  std::vector<int64_t> src_strides(size_t(n), 0);
  std::vector<int64_t> xs = x.shape().strides();
  for (int i = 0; i < x.ndim(); ++i) {
    int o = n - x.ndim() + i;
    src_strides[size_t(o)] = x.shape()[i] == 1 ? 0 : xs[size_t(i)];
  }
  Array out = Array::empty(shape, x.dtype());
  cpu::strided_copy(x.raw(), src_strides, out.raw(), shape.strides(), shape.dims(), dtype_size(x.dtype()));
  if (differentiable(out))
    record(out, "broadcast_to", {x}, [s = x.shape()](const Array& g) { return Grads{sum_to(g, s)}; });
  return out;
}

Array sum_to(const Array& x, const Shape& shape) {
  MT_CHECK(x.defined(), "[sum_to] undefined input array");
  if (x.shape() == shape) return x;
  const int lead = x.ndim() - shape.ndim();
  MT_CHECK(lead >= 0, "[sum_to] cannot sum ", x.str(), " to larger shape ", shape.str());
  std::vector<int> axes;
  for (int i = 0; i < x.ndim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1)) axes.push_back(i);
  Array s = sum(x, axes, /*keepdims=*/true);
  return reshape(s, shape.dims());
}

}  // namespace mt
