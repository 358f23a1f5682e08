#include "meshtrain/ops/optimizer_ops.h"

#include "meshtrain/backend/optimizer.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("optimizer", {"adam_moments", "adam_direction", "adam_moments_multi", "adam_direction_multi",
                                      "sum_squares_multi", "scale_multi", "add_multi", "cast_multi"});

namespace {

kernels::AdamHyper hyper(const AdamStep& s) {
  return {float(s.b1), float(s.b2), float(1 - s.b1), float(1 - s.b2), float(s.eps)};
}

void check_scalars(const Array& scalars, const Array& like, const char* op) {
  MT_CHECK(scalars.defined() && scalars.dtype() == DType::f32 && scalars.numel() == kernels::kAdamScalarCount &&
               !scalars.sharded(),
           "[", op, "] expects the step's scalars as a plain f32 array of ", int(kernels::kAdamScalarCount),
           " (adam_step_scalars), got ", scalars.defined() ? scalars.str() : std::string("an undefined array"));
  MT_CHECK(scalars.device() == like.device(), "[", op, "] the step's scalars are on ", scalars.device().str(),
           ", the tensors on ", like.device().str());
}

prim::OutputInfo check_f32_same_shape(const std::vector<Array>& in, const char* op) {
  for (const Array& a : in) {
    MT_CHECK(a.dtype() == DType::f32, "[", op, "] expects f32 arrays, got ", a.str());
    MT_CHECK(a.shape() == in[0].shape(), "[", op, "] shapes differ: ", in[0].str(), " and ", a.str());
  }
  return {in[0].shape(), DType::f32};
}

// The [2, ...] buffer that m and v are rows 0 and 1 of, when they are its only handles (so
// nobody can see it overwritten).
Array moments_buffer_to_reuse(const Array& m, const Array& v, const prim::OutputInfo& o) {
  if (!Array::sole_owners({&m, &v}) || m.impl()->offset_bytes != 0 || v.impl()->offset_bytes != m.nbytes())
    return Array();
  auto impl = std::make_shared<ArrayImpl>(*m.impl());
  impl->shape = o.shape;
  return Array(std::move(impl));
}

// Optimizer state is not differentiated through; the defaults (replicated layout, no VJP)
// are what these need.
class AdamMomentsPrimitive final : public prim::Primitive {
 public:
  explicit AdamMomentsPrimitive(const AdamStep& s) : h_(hyper(s)) {}
  const char* name() const override { return "adam_moments"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    std::vector<int64_t> dims{2};
    for (int64_t d : check_f32_same_shape(in, name()).shape) dims.push_back(d);
    return {Shape(dims), DType::f32};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    Array out = moments_buffer_to_reuse(in[1], in[2], o);
    if (!out.defined()) out = Array::empty(o.shape, o.dtype);
    // Element i of the output depends only on element i of the inputs, read first: writing
    // over m and v is safe.
    MT_KERNEL(out, adam_moments, in[0], in[1], in[2], h_, out);
    return out;
  }
  bool differentiable(const std::vector<Array>&, const prim::OutputInfo&) const override { return false; }
  uint32_t keeps_inputs() const override { return 0; }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo&) const override {
    const double n = double(in[0].numel());
    return {7 * n, 4.0 * 5 * n};
  }

 private:
  kernels::AdamHyper h_;
};

// Inputs m, v, p, scalars; p decays when `decays`.
class AdamDirectionPrimitive final : public prim::Primitive {
 public:
  AdamDirectionPrimitive(const AdamStep& s, bool decays) : h_(hyper(s)), decays_(decays) {}
  const char* name() const override { return "adam_direction"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    MT_CHECK(in.size() == 4, "[", name(), "] expects m, v, p and the step's scalars, got ", in.size(), " arrays");
    check_scalars(in[3], in[0], name());
    return check_f32_same_shape({in[0], in[1], in[2]}, name());
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, adam_direction, in[0], in[1], decays_ ? &in[2] : nullptr, h_, in[3], out);
    return out;
  }
  bool differentiable(const std::vector<Array>&, const prim::OutputInfo&) const override { return false; }
  uint32_t keeps_inputs() const override { return 0; }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo&) const override {
    const double n = double(in[0].numel());
    return {6 * n, 4.0 * (3 + decays_) * n};
  }

 private:
  kernels::AdamHyper h_;
  bool decays_;
};

// Inputs of the multi-tensor primitives: three groups of k f32 arrays (the first 3k of `in`);
// group 0's shapes name the tensors, the others must match them one for one.
int64_t check_groups(const std::vector<Array>& in, size_t count, const char* op) {
  MT_CHECK(count > 0 && count % 3 == 0 && count <= in.size(), "[", op, "] expects three groups of k arrays, got ",
           count);
  const size_t k = count / 3;
  int64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    MT_CHECK(in[i].dtype() == DType::f32, "[", op, "] expects f32 arrays, got ", in[i].str(), " (input ", i, ")");
    MT_CHECK(in[i].shape() == in[i % k].shape(), "[", op, "] tensor ", i % k, ": shapes differ: ", in[i % k].str(),
             " and ", in[i].str());
    if (i < k) total += in[i].numel();
  }
  return total;
}

// The [2, total] buffer that the k m's and v's are views of, in order, when they are its only
// handles: the multi-tensor form of moments_buffer_to_reuse.
Array flat_moments_to_reuse(const std::vector<Array>& in, const prim::OutputInfo& o) {
  const size_t k = in.size() / 3;
  const int64_t total = o.shape.dim(1);
  std::vector<const Array*> slots;
  for (size_t i = k; i < 3 * k; ++i) slots.push_back(&in[i]);
  if (!Array::sole_owners(slots)) return Array();
  const size_t base = in[k].impl()->offset_bytes;
  if (base != 0) return Array();
  int64_t offset = 0;
  for (size_t j = 0; j < k; ++j) {
    if (in[k + j].impl()->offset_bytes != size_t(offset) * 4 ||
        in[2 * k + j].impl()->offset_bytes != size_t(total + offset) * 4)
      return Array();
    offset += in[j].numel();
  }
  auto impl = std::make_shared<ArrayImpl>(*in[k].impl());
  impl->shape = o.shape;
  return Array(std::move(impl));
}


class AdamMomentsMultiPrimitive final : public prim::Primitive {
 public:
  explicit AdamMomentsMultiPrimitive(const AdamStep& s) : h_(hyper(s)) {}
  const char* name() const override { return "adam_moments_multi"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    return {Shape({2, check_groups(in, in.size(), name())}), DType::f32};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    Array out = flat_moments_to_reuse(in, o);
    if (!out.defined()) out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, adam_moments_multi, in, h_, out);
    return out;
  }
  bool differentiable(const std::vector<Array>&, const prim::OutputInfo&) const override { return false; }
  uint32_t keeps_inputs() const override { return 0; }
  prim::Cost cost(const std::vector<Array>&, const prim::OutputInfo& o) const override {
    const double n = double(o.shape.numel() / 2);
    return {7 * n, 4.0 * 5 * n};
  }

 private:
  kernels::AdamHyper h_;
};

// Inputs m_0.., v_0.., p_0.., the step's scalars, then k destinations d_0..: tensor j's update
// is written over d_j (the builder hands in buffers nobody else can see) and the output is d_0.
class AdamDirectionMultiPrimitive final : public prim::Primitive {
 public:
  AdamDirectionMultiPrimitive(const AdamStep& s, std::vector<uint8_t> decays) : h_(hyper(s)), decays_(std::move(decays)) {}
  const char* name() const override { return "adam_direction_multi"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    const size_t k = decays_.size();
    MT_CHECK(k > 0 && in.size() == 4 * k + 1, "[", name(), "] expects m, v, p and destinations for ", k,
             " tensors and the step's scalars, got ", in.size(), " arrays");
    check_groups(in, 3 * k, name());
    check_scalars(in[3 * k], in[0], name());
    for (size_t j = 0; j < k; ++j) {
      const Array& d = in[3 * k + 1 + j];
      MT_CHECK(d.dtype() == DType::f32 && d.shape() == in[j].shape() && d.device() == in[j].device(), "[", name(),
               "] tensor ", j, ": destination ", d.str(), " for an update of ", in[j].str());
    }
    return {in[0].shape(), DType::f32};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo&, std::vector<Array>&) const override {
    const size_t k = decays_.size();
    const std::vector<Array> tensors(in.begin(), in.begin() + std::ptrdiff_t(3 * k));
    std::vector<Array> outs(in.begin() + std::ptrdiff_t(3 * k + 1), in.end());
    MT_KERNEL(outs[0], adam_direction_multi, tensors, decays_, h_, in[3 * k], outs);
    return Array(std::make_shared<ArrayImpl>(*outs[0].impl()));  // a second handle, not the input's
  }
  bool differentiable(const std::vector<Array>&, const prim::OutputInfo&) const override { return false; }
  uint32_t keeps_inputs() const override { return 0; }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo&) const override {
    double n = 0;
    for (size_t j = 0; j < decays_.size(); ++j) n += double(in[j].numel());
    return {6 * n, 4.0 * 4 * n};
  }

 private:
  kernels::AdamHyper h_;
  std::vector<uint8_t> decays_;
};

}  // namespace

Array adam_moments_multi(const std::vector<Array>& g, std::vector<Array> m, std::vector<Array> v,
                         const AdamStep& step) {
  MT_CHECK(g.size() == m.size() && g.size() == v.size(), "[adam_moments_multi] ", g.size(), " gradients, ", m.size(),
           " m's and ", v.size(), " v's");
  std::vector<Array> in;  // built by moving: the state's moments stay sole owners of their buffer
  in.reserve(3 * g.size());
  for (const Array& a : g) in.push_back(a);
  for (Array& a : m) in.push_back(std::move(a));
  for (Array& a : v) in.push_back(std::move(a));
  for (const Array& a : in) MT_CHECK(a.defined(), "[adam_moments_multi] undefined input array");
  return prim::apply(std::make_shared<AdamMomentsMultiPrimitive>(step), in);
}

namespace {
void check_direction_arguments(const std::vector<Array>& m, const std::vector<Array>& v, const std::vector<Array>& p,
                               const std::vector<bool>& decays) {
  MT_CHECK(m.size() == v.size() && m.size() == p.size() && m.size() == decays.size(), "[adam_direction_multi] ",
           m.size(), " m's, ", v.size(), " v's, ", p.size(), " parameters and ", decays.size(), " decay flags");
  MT_CHECK(!m.empty(), "[adam_direction_multi] no tensors");
  for (const auto* group : {&m, &v, &p})
    for (const Array& a : *group) MT_CHECK(a.defined(), "[adam_direction_multi] undefined input array");
}

// A plain array with x's whole value: the kernel writes its updates into plain destinations,
// which a distributed call would replace by copies.
Array whole(const Array& x) { return x.distributed() ? prim::distributed_executor()->gather(x).detach() : x; }

// Applies the primitive with `destinations` moved in after the tensors and the scalars.
// (optim::adamw passes local blocks; distributed tensors are gathered, as a replicated rule
// would gather them.)
void direction_into(const std::vector<Array>& m, const std::vector<Array>& v, const std::vector<Array>& p,
                    const AdamStep& step, const std::vector<bool>& decays, const Array& scalars,
                    std::vector<Array>& destinations) {
  std::vector<Array> in;
  in.reserve(4 * m.size() + 1);
  for (const auto* group : {&m, &v, &p})
    for (const Array& a : *group) in.push_back(whole(a));
  in.push_back(scalars);
  for (Array& d : destinations) in.push_back(std::move(d));
  prim::apply(std::make_shared<AdamDirectionMultiPrimitive>(step, std::vector<uint8_t>(decays.begin(), decays.end())),
              in);
  for (size_t j = 0; j < destinations.size(); ++j) destinations[j] = std::move(in[3 * m.size() + 1 + j]);
}
}  // namespace

Array adam_direction_multi(const std::vector<Array>& m, const std::vector<Array>& v, const std::vector<Array>& p,
                           const AdamStep& step, const std::vector<bool>& decays, const Array& scalars) {
  check_direction_arguments(m, v, p, decays);
  int64_t total = 0;
  for (const Array& a : m) total += a.numel();
  const Array flat = Array::empty(Shape({total}), DType::f32, m[0].device());
  std::vector<Array> pieces;
  int64_t offset = 0;
  for (const Array& a : m) {
    pieces.push_back(flat.view_elements(offset, a.shape()));
    offset += a.numel();
  }
  direction_into(m, v, p, step, decays, scalars, pieces);
  return flat;
}

std::vector<Array> adam_direction_multi_into(std::vector<Array> gradients, const std::vector<Array>& m,
                                             const std::vector<Array>& v, const std::vector<Array>& p,
                                             const AdamStep& step, const std::vector<bool>& decays,
                                             const Array& scalars) {
  check_direction_arguments(m, v, p, decays);
  MT_CHECK(gradients.size() == m.size(), "[adam_direction_multi] ", gradients.size(), " gradients for ", m.size(),
           " tensors");
  for (size_t j = 0; j < m.size(); ++j) {
    Array& g = gradients[j];
    // Written over only where nobody else can see it: a gradient the caller kept, a view, or
    // one of another dtype, shape or device gets a buffer of its own.
    if (!(g.defined() && g.sole_owner() && g.dtype() == DType::f32 && g.shape() == m[j].shape() &&
          g.device() == m[j].device()))
      g = Array::empty(m[j].shape(), DType::f32, m[j].device());
  }
  direction_into(m, v, p, step, decays, scalars, gradients);
  return gradients;
}

Array adam_step_scalars(const AdamStep& step, Device device) {
  Array scalars = Array::empty(Shape({kernels::kAdamScalarCount}), DType::f32, device);
  write_adam_step_scalars(scalars, step);
  return scalars;
}

void write_adam_step_scalars(const Array& scalars, const AdamStep& step) {
  MT_CHECK(scalars.dtype() == DType::f32 && scalars.numel() == kernels::kAdamScalarCount,
           "[write_adam_step_scalars] expects an f32 array of ", int(kernels::kAdamScalarCount), ", got ", scalars.str());
  float values[kernels::kAdamScalarCount];
  values[kernels::kAdamStepSize] = float(step.step_size);
  values[kernels::kAdamSqrtBc2] = float(step.sqrt_bc2);
  values[kernels::kAdamDecay] = float(step.decay);
  scalars.write_from_host(values);
}

Array adam_moments(const Array& g, Array m, Array v, const AdamStep& step) {
  MT_CHECK(g.defined() && m.defined() && v.defined(), "[adam_moments] undefined input array");
  std::vector<Array> in;  // built by moving: an initializer list would copy m and v
  in.reserve(3);
  in.push_back(g);
  in.push_back(std::move(m));
  in.push_back(std::move(v));
  return prim::apply(std::make_shared<AdamMomentsPrimitive>(step), in);
}

Array adam_direction(const Array& m, const Array& v, const Array& p, const AdamStep& step, const Array& scalars) {
  MT_CHECK(m.defined() && v.defined() && p.defined(), "[adam_direction] undefined input array");
  return prim::apply(std::make_shared<AdamDirectionPrimitive>(step, step.decay != 0.0), {m, v, p, scalars});
}

Array adam_direction(const Array& m, const Array& v, const Array& p, const AdamStep& step) {
  MT_CHECK(m.defined(), "[adam_direction] undefined input array");
  return adam_direction(m, v, p, step, adam_step_scalars(step, m.device()));
}

namespace {

// The clipping and update primitives' tensors: floating, one dtype and device, plain (the
// builders gather distributed ones; optim::global_norm keeps those on the composed ops, whose
// sums span the mesh without a gather).
int64_t check_multi_tensors(const std::vector<Array>& xs, size_t count, const char* op) {
  MT_CHECK(count > 0, "[", op, "] no tensors");
  int64_t total = 0;
  for (size_t j = 0; j < count; ++j) {
    const Array& x = xs[j];
    MT_CHECK(x.defined(), "[", op, "] tensor ", j, " is undefined");
    MT_CHECK(is_floating(x.dtype()), "[", op, "] expects floating arrays, got ", x.str(), " (tensor ", j, ")");
    MT_CHECK(x.dtype() == xs[0].dtype() && x.device() == xs[0].device(), "[", op, "] tensor ", j, " is ", x.str(),
             " on ", x.device().str(), ", tensor 0 ", xs[0].str(), " on ", xs[0].device().str(),
             ": one dtype and device per call");
    total += x.numel();
  }
  return total;
}

class SumSquaresMultiPrimitive final : public prim::Primitive {
 public:
  const char* name() const override { return "sum_squares_multi"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    check_multi_tensors(in, in.size(), name());
    return {Shape(), DType::f32};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, sum_squares_multi, in, out);
    return out;
  }
  std::vector<Array> vjp(const prim::Saved& s, const Array& g) const override {
    std::vector<Array> grads(s.inputs.size());
    const Array twice_g = mul(g, 2.0);
    for (size_t j = 0; j < grads.size(); ++j)
      if (s.wants(j)) {
        const Array& x = s.inputs[j];
        grads[j] = x.dtype() == DType::f32 ? mul(x, twice_g) : cast(mul(cast(x, DType::f32), twice_g), x.dtype());
      }
    return grads;
  }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo&) const override {
    double n = 0, bytes = 0;
    for (const Array& x : in) n += double(x.numel()), bytes += double(x.nbytes());
    return {2 * n, bytes};
  }
};

// A multi-tensor primitive that writes its k results over k destinations handed in last (the
// builder's buffers nobody else can see, possibly the first k inputs' own: apply_into), d_j
// shaped like input j; its output is a second handle to d_0. `passes`: memory passes per
// element, for the cost.
class MultiTensorIntoPrimitive : public prim::Primitive {
 public:
  MultiTensorIntoPrimitive(size_t k, double passes) : k_(k), passes_(passes) {}
  bool differentiable(const std::vector<Array>&, const prim::OutputInfo&) const override { return false; }
  uint32_t keeps_inputs() const override { return 0; }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo&) const override {
    double n = 0, bytes = 0;
    for (size_t j = 0; j < k_; ++j) n += double(in[j].numel()), bytes += passes_ * double(in[j].nbytes());
    return {n, bytes};
  }

 protected:
  void check_destinations(const std::vector<Array>& in) const {
    for (size_t j = 0; j < k_; ++j) {
      const Array& d = in[in.size() - k_ + j];
      MT_CHECK(d.dtype() == in[j].dtype() && d.shape() == in[j].shape() && d.device() == in[j].device(), "[",
               name(), "] tensor ", j, ": destination ", d.str(), " for ", in[j].str());
    }
  }
  std::vector<Array> destinations(const std::vector<Array>& in) const {
    return {in.end() - std::ptrdiff_t(k_), in.end()};
  }
  static Array second_handle(const Array& d) { return Array(std::make_shared<ArrayImpl>(*d.impl())); }
  size_t k_;

 private:
  double passes_;
};

// Inputs x_0..x_{k-1}, the scale, then the destinations: x_j · scale.
class ScaleMultiPrimitive final : public MultiTensorIntoPrimitive {
 public:
  explicit ScaleMultiPrimitive(size_t k) : MultiTensorIntoPrimitive(k, 2.0) {}
  const char* name() const override { return "scale_multi"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    MT_CHECK(in.size() == 2 * k_ + 1, "[", name(), "] expects ", k_, " tensors, the scale and ", k_,
             " destinations, got ", in.size(), " arrays");
    check_multi_tensors(in, k_, name());
    const Array& scale = in[k_];
    MT_CHECK(scale.defined() && scale.dtype() == DType::f32 && scale.numel() == 1 && !scale.distributed() &&
                 scale.device() == in[0].device(),
             "[", name(), "] expects the scale as an f32 array of one element on ", in[0].device().str(), ", got ",
             scale.defined() ? scale.str() + " on " + scale.device().str() : std::string("an undefined array"));
    check_destinations(in);
    return {in[0].shape(), in[0].dtype()};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo&, std::vector<Array>&) const override {
    const std::vector<Array> xs(in.begin(), in.begin() + std::ptrdiff_t(k_));
    std::vector<Array> outs = destinations(in);
    MT_KERNEL(outs[0], scale_multi, xs, in[k_], outs);
    return second_handle(outs[0]);
  }
};

// Inputs a_0..a_{k-1}, b_0..b_{k-1}, then the destinations: a_j + b_j.
class AddMultiPrimitive final : public MultiTensorIntoPrimitive {
 public:
  explicit AddMultiPrimitive(size_t k) : MultiTensorIntoPrimitive(k, 3.0) {}
  const char* name() const override { return "add_multi"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    MT_CHECK(in.size() == 3 * k_, "[", name(), "] expects ", k_, " tensors, ", k_, " addends and ", k_,
             " destinations, got ", in.size(), " arrays");
    check_multi_tensors(in, 2 * k_, name());
    for (size_t j = 0; j < k_; ++j)
      MT_CHECK(in[k_ + j].shape() == in[j].shape(), "[", name(), "] tensor ", j, ": ", in[j].str(), " + ",
               in[k_ + j].str());
    check_destinations(in);
    return {in[0].shape(), in[0].dtype()};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo&, std::vector<Array>&) const override {
    const std::vector<Array> operands(in.begin(), in.begin() + std::ptrdiff_t(2 * k_));
    std::vector<Array> outs = destinations(in);
    MT_KERNEL(outs[0], add_multi, operands, outs);
    return second_handle(outs[0]);
  }
};

// Inputs x_0..x_{k-1}, then k destinations of the target dtype: x_j cast to it.
class CastMultiPrimitive final : public prim::Primitive {
 public:
  explicit CastMultiPrimitive(size_t k) : k_(k) {}
  const char* name() const override { return "cast_multi"; }
  bool differentiable(const std::vector<Array>&, const prim::OutputInfo&) const override { return false; }
  uint32_t keeps_inputs() const override { return 0; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    MT_CHECK(in.size() == 2 * k_, "[", name(), "] expects ", k_, " tensors and ", k_, " destinations, got ",
             in.size(), " arrays");
    check_multi_tensors(in, k_, name());
    const std::vector<Array> outs(in.begin() + std::ptrdiff_t(k_), in.end());
    check_multi_tensors(outs, k_, name());
    for (size_t j = 0; j < k_; ++j)
      MT_CHECK(outs[j].shape() == in[j].shape() && outs[j].device() == in[j].device(), "[", name(), "] tensor ", j,
               ": destination ", outs[j].str(), " for ", in[j].str());
    return {outs[0].shape(), outs[0].dtype()};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo&, std::vector<Array>&) const override {
    const std::vector<Array> xs(in.begin(), in.begin() + std::ptrdiff_t(k_));
    std::vector<Array> outs(in.begin() + std::ptrdiff_t(k_), in.end());
    MT_KERNEL(outs[0], cast_multi, xs, outs);
    return Array(std::make_shared<ArrayImpl>(*outs[0].impl()));  // a second handle to d_0
  }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo&) const override {
    double bytes = 0;
    for (const Array& x : in) bytes += double(x.nbytes());
    return {0, bytes};
  }

 private:
  size_t k_;
};

// Applies a MultiTensorIntoPrimitive to xs (moved in), `rest` and the destinations, and returns
// the k results: each x_j is written over where nobody else can see its buffer (asked before
// any second handle exists), else into a new array of its kind. Distributed x_j are gathered
// first.
std::vector<Array> apply_into(const prim::PrimitivePtr& primitive, std::vector<Array> xs, const std::vector<Array>& rest,
                              const char* op) {
  const size_t k = xs.size();
  for (Array& x : xs)
    if (x.defined() && x.distributed()) x = whole(x);
  check_multi_tensors(xs, k, op);
  std::vector<Array> destinations;
  for (const Array& x : xs)
    destinations.push_back(x.sole_owner() ? Array() : Array::empty(x.shape(), x.dtype(), x.device()));
  std::vector<Array> in(xs.begin(), xs.end());
  in.insert(in.end(), rest.begin(), rest.end());
  for (size_t j = 0; j < k; ++j) in.push_back(destinations[j].defined() ? std::move(destinations[j]) : xs[j]);
  xs.clear();
  prim::apply(primitive, in);
  return {std::make_move_iterator(in.end() - std::ptrdiff_t(k)), std::make_move_iterator(in.end())};
}

}  // namespace

Array sum_of_squares_multi(const std::vector<Array>& xs) {
  check_multi_tensors(xs, xs.size(), "sum_squares_multi");
  return prim::apply(std::make_shared<SumSquaresMultiPrimitive>(), xs);
}

std::vector<Array> scale_multi_into(std::vector<Array> xs, const Array& scale) {
  const size_t k = xs.size();
  return apply_into(std::make_shared<ScaleMultiPrimitive>(k), std::move(xs), {scale}, "scale_multi");
}

std::vector<Array> cast_multi(const std::vector<Array>& xs, DType dtype) {
  const size_t k = xs.size();
  MT_CHECK(is_floating(dtype), "[cast_multi] casts to a floating dtype, got ", dtype_name(dtype));
  std::vector<Array> in;
  for (const Array& x : xs) in.push_back(x.defined() && x.distributed() ? whole(x) : x);
  check_multi_tensors(in, k, "cast_multi");
  for (size_t j = 0; j < k; ++j) in.push_back(Array::empty(in[j].shape(), dtype, in[j].device()));
  prim::apply(std::make_shared<CastMultiPrimitive>(k), in);
  return {in.begin() + std::ptrdiff_t(k), in.end()};
}

std::vector<Array> add_multi_into(std::vector<Array> a, const std::vector<Array>& b) {
  const size_t k = a.size();
  MT_CHECK(b.size() == k, "[add_multi] ", k, " tensors and ", b.size(), " addends");
  std::vector<Array> addends;
  for (const Array& x : b) addends.push_back(x.defined() && x.distributed() ? whole(x) : x);
  return apply_into(std::make_shared<AddMultiPrimitive>(k), std::move(a), addends, "add_multi");
}

}  // namespace mt
