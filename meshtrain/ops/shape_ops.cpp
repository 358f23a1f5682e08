// Shape primitives: reshape (a view), transpose, slice and its adjoint pad_into,
// concatenate, broadcast_to. split, stack, expand_dims, squeeze and sum_to compose them.
#include "meshtrain/ops/shape_ops.h"

#include <algorithm>
#include <numeric>

#include "meshtrain/backend/strided_copy.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("shape", {"reshape", "transpose", "slice", "pad_into", "concatenate", "broadcast_to"});

using layout::ArgInfo;
using layout::MeshShape;
using layout::RuleResult;
using prim::OutputInfo;
using prim::Saved;
using Grads = std::vector<Array>;
using Inputs = std::vector<Array>;

namespace {

void check_defined(const Array& x, const char* op) { MT_CHECK(x.defined(), "[", op, "] undefined input array"); }

// Shape primitives move data without arithmetic: no flops, every byte read and written.
prim::Cost copy_cost(const OutputInfo& o) { return {0, 2.0 * double(o.shape.numel()) * double(dtype_size(o.dtype))}; }

class ReshapePrimitive final : public prim::Primitive {
 public:
  explicit ReshapePrimitive(Shape target) : target_(std::move(target)) {}
  const char* name() const override { return "reshape"; }
  OutputInfo infer(const Inputs& in) const override {
    MT_CHECK(target_.numel() == in[0].numel(), "[reshape] cannot reshape ", in[0].str(), " to ", target_.str());
    return {target_, in[0].dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override { return in[0].view_as_shape(o.shape); }
  uint32_t keeps_inputs() const override { return 0; }
  Grads vjp(const Saved& s, const Array& g) const override { return {reshape(g, s.shapes[0].dims())}; }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::reshape(in, mesh, target_);
  }
  // Each rank reshapes its block to its block of the target.
  prim::PrimitivePtr localize(const prim::LocalContext& ctx, const prim::PrimitivePtr&) const override {
    return std::make_shared<ReshapePrimitive>(ctx.output_local);
  }
  prim::Cost cost(const Inputs&, const OutputInfo&) const override { return {}; }

 private:
  Shape target_;
};

class TransposePrimitive final : public prim::Primitive {
 public:
  explicit TransposePrimitive(std::vector<int> perm) : perm_(std::move(perm)) {}
  const char* name() const override { return "transpose"; }
  OutputInfo infer(const Inputs& in) const override {
    const Array& x = in[0];
    std::vector<int64_t> dims;
    for (int p : perm_) dims.push_back(x.shape()[p]);
    return {Shape(dims), x.dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const Array& x = in[0];
    std::vector<int64_t> src_strides(perm_.size());
    std::vector<int64_t> xs = x.shape().strides();
    for (size_t i = 0; i < perm_.size(); ++i) src_strides[i] = xs[size_t(perm_[i])];
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, strided_copy, x.raw(), src_strides, out.raw(), o.shape.strides(), o.shape.dims(), dtype_size(x.dtype()));
    return out;
  }
  uint32_t keeps_inputs() const override { return 0; }
  Grads vjp(const Saved&, const Array& g) const override {
    std::vector<int> inverse(perm_.size());
    for (size_t i = 0; i < perm_.size(); ++i) inverse[size_t(perm_[i])] = int(i);
    return {transpose(g, inverse)};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::transpose(in, mesh, perm_);
  }
  prim::Cost cost(const Inputs&, const OutputInfo& o) const override { return copy_cost(o); }

 private:
  std::vector<int> perm_;
};

// x[..., start:stop, ...] along `axis` (start and stop already clamped to the axis).
class SlicePrimitive final : public prim::Primitive {
 public:
  SlicePrimitive(int axis, int64_t start, int64_t stop) : axis_(axis), start_(start), stop_(stop) {}
  const char* name() const override { return "slice"; }
  OutputInfo infer(const Inputs& in) const override {
    std::vector<int64_t> dims = in[0].shape().dims();
    dims[size_t(axis_)] = stop_ - start_;
    return {Shape(dims), in[0].dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const Array& x = in[0];
    Array out = Array::empty(o.shape, o.dtype);
    std::vector<int64_t> xs = x.shape().strides();
    const char* src = static_cast<const char*>(x.raw()) + size_t(start_ * xs[size_t(axis_)]) * dtype_size(x.dtype());
    MT_KERNEL(out, strided_copy, src, xs, out.raw(), o.shape.strides(), o.shape.dims(), dtype_size(x.dtype()));
    return out;
  }
  uint32_t keeps_inputs() const override { return 0; }
  Grads vjp(const Saved& s, const Array& g) const override { return {pad_into(g, s.shapes[0], axis_, start_)}; }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::gather_dims(in, mesh, {axis_}, true);
  }
  prim::Cost cost(const Inputs&, const OutputInfo& o) const override { return copy_cost(o); }

 private:
  int axis_;
  int64_t start_, stop_;
};

// Zeros of shape `full` with x placed at `start` along `axis` (the adjoint of slice).
class PadIntoPrimitive final : public prim::Primitive {
 public:
  PadIntoPrimitive(Shape full, int axis, int64_t start) : full_(std::move(full)), axis_(axis), start_(start) {}
  const char* name() const override { return "pad_into"; }
  OutputInfo infer(const Inputs& in) const override {
    const Array& x = in[0];
    MT_CHECK(x.ndim() == full_.ndim(), "[pad_into] rank mismatch: ", x.str(), " into ", full_.str());
    // The copy writes raw memory: a block that does not fit must be an error, not corruption.
    bool fits = start_ >= 0 && start_ + x.shape()[axis_] <= full_[axis_];
    for (int d = 0; d < full_.ndim(); ++d) fits = fits && (d == axis_ || x.shape()[d] == full_[d]);
    MT_CHECK(fits, "[pad_into] cannot place ", x.str(), " into ", full_.str(), " at ", start_, " along axis ", axis_);
    return {full_, x.dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const Array& x = in[0];
    Array out = Array::zeros(o.shape, o.dtype);
    std::vector<int64_t> fs = o.shape.strides();
    char* dst = static_cast<char*>(out.raw()) + size_t(start_ * fs[size_t(axis_)]) * dtype_size(x.dtype());
    MT_KERNEL(out, strided_copy, x.raw(), x.shape().strides(), dst, fs, x.shape().dims(), dtype_size(x.dtype()));
    return out;
  }
  uint32_t keeps_inputs() const override { return 0; }
  Grads vjp(const Saved& s, const Array& g) const override {
    return {slice(g, axis_, start_, start_ + s.shapes[0][axis_])};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::gather_dims(in, mesh, {axis_}, true);
  }
  // Other dims keep their split: each rank pads its block to its block of `full`.
  prim::PrimitivePtr localize(const prim::LocalContext& ctx, const prim::PrimitivePtr&) const override {
    return std::make_shared<PadIntoPrimitive>(ctx.output_local, axis_, start_);
  }
  prim::Cost cost(const Inputs&, const OutputInfo& o) const override { return copy_cost(o); }

 private:
  Shape full_;
  int axis_;
  int64_t start_;
};

class ConcatenatePrimitive final : public prim::Primitive {
 public:
  explicit ConcatenatePrimitive(int axis) : axis_(axis) {}
  const char* name() const override { return "concatenate"; }
  OutputInfo infer(const Inputs& xs) const override {
    const Array& first = xs[0];
    std::vector<int64_t> dims = first.shape().dims();
    int64_t total = 0;
    for (const Array& x : xs) {
      check_defined(x, "concatenate");
      MT_CHECK(x.dtype() == first.dtype(), "[concatenate] dtype mismatch: ", first.str(), " vs ", x.str());
      MT_CHECK(x.ndim() == first.ndim(), "[concatenate] rank mismatch: ", first.str(), " vs ", x.str());
      for (int d = 0; d < x.ndim(); ++d)
        MT_CHECK(d == axis_ || x.shape()[d] == first.shape()[d], "[concatenate] shapes ", first.shape().str(),
                 " and ", x.shape().str(), " differ outside axis ", axis_);
      total += x.shape()[axis_];
    }
    dims[size_t(axis_)] = total;
    return {Shape(dims), first.dtype()};
  }
  Array run(const Inputs& xs, const OutputInfo& o, Inputs&) const override {
    Array out = Array::empty(o.shape, o.dtype);
    std::vector<int64_t> os = o.shape.strides();
    int64_t offset = 0;
    for (const Array& x : xs) {
      char* dst = static_cast<char*>(out.raw()) + size_t(offset * os[size_t(axis_)]) * dtype_size(x.dtype());
      MT_KERNEL(out, strided_copy, x.raw(), x.shape().strides(), dst, os, x.shape().dims(), dtype_size(x.dtype()));
      offset += x.shape()[axis_];
    }
    return out;
  }
  uint32_t keeps_inputs() const override { return 0; }
  Grads vjp(const Saved& s, const Array& g) const override {
    std::vector<int64_t> sizes;
    for (const Shape& sh : s.shapes) sizes.push_back(sh[axis_]);
    return split(g, sizes, axis_);
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::concatenate(in, mesh, axis_);
  }
  prim::Cost cost(const Inputs&, const OutputInfo& o) const override { return copy_cost(o); }

 private:
  int axis_;
};

class BroadcastToPrimitive final : public prim::Primitive {
 public:
  explicit BroadcastToPrimitive(Shape shape) : shape_(std::move(shape)) {}
  const char* name() const override { return "broadcast_to"; }
  OutputInfo infer(const Inputs& in) const override {
    Shape b = broadcast_shapes(in[0].shape(), shape_, "broadcast_to");
    MT_CHECK(b == shape_, "[broadcast_to] cannot broadcast ", in[0].str(), " to ", shape_.str());
    return {shape_, in[0].dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const Array& x = in[0];
    const int n = o.shape.ndim();
    std::vector<int64_t> src_strides(size_t(n), 0);
    std::vector<int64_t> xs = x.shape().strides();
    for (int i = 0; i < x.ndim(); ++i) {
      int d = n - x.ndim() + i;
      src_strides[size_t(d)] = x.shape()[i] == 1 ? 0 : xs[size_t(i)];
    }
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, strided_copy, x.raw(), src_strides, out.raw(), o.shape.strides(), o.shape.dims(), dtype_size(x.dtype()));
    return out;
  }
  uint32_t keeps_inputs() const override { return 0; }
  Grads vjp(const Saved& s, const Array& g) const override { return {sum_to(g, s.shapes[0])}; }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::broadcast_to(in, mesh, shape_);
  }
  prim::PrimitivePtr localize(const prim::LocalContext& ctx, const prim::PrimitivePtr&) const override {
    return std::make_shared<BroadcastToPrimitive>(ctx.output_local);
  }
  prim::Cost cost(const Inputs&, const OutputInfo& o) const override { return copy_cost(o); }

 private:
  Shape shape_;
};

}  // namespace

Array reshape(const Array& x, std::vector<int64_t> shape) {
  check_defined(x, "reshape");
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
  return prim::apply(std::make_shared<ReshapePrimitive>(Shape(shape)), {x});
}

Array transpose(const Array& x, std::vector<int> perm) {
  check_defined(x, "transpose");
  MT_CHECK(int(perm.size()) == x.ndim(), "[transpose] permutation of length ", perm.size(), " for ", x.str());
  std::vector<bool> seen(perm.size(), false);
  for (int& p : perm) {
    p = x.shape().axis(p, "transpose");
    MT_CHECK(!seen[size_t(p)], "[transpose] repeated axis in permutation for ", x.str());
    seen[size_t(p)] = true;
  }
  return prim::apply(std::make_shared<TransposePrimitive>(std::move(perm)), {x});
}

Array swap_axes(const Array& x, int a, int b) {
  MT_CHECK(x.defined(), "[swap_axes] undefined input array");
  std::vector<int> perm(size_t(x.ndim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[size_t(x.shape().axis(a, "swap_axes"))], perm[size_t(x.shape().axis(b, "swap_axes"))]);
  return transpose(x, perm);
}

Array slice(const Array& x, int axis, int64_t start, int64_t stop) {
  check_defined(x, "slice");
  axis = x.shape().axis(axis, "slice");
  const int64_t n = x.shape()[axis];
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  start = std::clamp<int64_t>(start, 0, n);
  stop = std::clamp<int64_t>(stop, start, n);
  return prim::apply(std::make_shared<SlicePrimitive>(axis, start, stop), {x});
}

Array pad_into(const Array& x, const Shape& full, int axis, int64_t start) {
  check_defined(x, "pad_into");
  MT_CHECK(x.ndim() == full.ndim(), "[pad_into] rank mismatch: ", x.str(), " into ", full.str());
  axis = full.axis(axis, "pad_into");
  return prim::apply(std::make_shared<PadIntoPrimitive>(full, axis, start), {x});
}

Array concatenate(const std::vector<Array>& xs, int axis) {
  MT_CHECK(!xs.empty(), "[concatenate] no arrays given");
  check_defined(xs[0], "concatenate");
  axis = xs[0].shape().axis(axis, "concatenate");
  return prim::apply(std::make_shared<ConcatenatePrimitive>(axis), xs);
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
  check_defined(x, "broadcast_to");
  if (x.shape() == shape) return x;
  return prim::apply(std::make_shared<BroadcastToPrimitive>(shape), {x});
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
