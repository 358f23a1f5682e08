#include "meshtrain/ops/optimizer_ops.h"

#include "meshtrain/backend/cpu/optimizer_kernels.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/core/error.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("optimizer", {"adam_moments", "adam_direction"});

namespace {

cpu::AdamHyper hyper(const AdamStep& s) {
  return {float(s.b1),        float(s.b2),       float(1 - s.b1), float(1 - s.b2),
          float(s.step_size), float(s.sqrt_bc2), float(s.eps),    float(s.decay)};
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
  cpu::AdamHyper h_;
};

class AdamDirectionPrimitive final : public prim::Primitive {
 public:
  explicit AdamDirectionPrimitive(const AdamStep& s) : h_(hyper(s)) {}
  const char* name() const override { return "adam_direction"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override { return check_f32_same_shape(in, name()); }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, adam_direction, in[0], in[1], h_.decay != 0.0f ? &in[2] : nullptr, h_, out);
    return out;
  }
  bool differentiable(const std::vector<Array>&, const prim::OutputInfo&) const override { return false; }
  uint32_t keeps_inputs() const override { return 0; }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo&) const override {
    const double n = double(in[0].numel());
    return {6 * n, 4.0 * (3 + (h_.decay != 0.0f)) * n};
  }

 private:
  cpu::AdamHyper h_;
};

}  // namespace

Array adam_moments(const Array& g, Array m, Array v, const AdamStep& step) {
  MT_CHECK(g.defined() && m.defined() && v.defined(), "[adam_moments] undefined input array");
  std::vector<Array> in;  // built by moving: an initializer list would copy m and v
  in.reserve(3);
  in.push_back(g);
  in.push_back(std::move(m));
  in.push_back(std::move(v));
  return prim::apply(std::make_shared<AdamMomentsPrimitive>(step), in);
}

Array adam_direction(const Array& m, const Array& v, const Array& p, const AdamStep& step) {
  MT_CHECK(m.defined() && v.defined() && p.defined(), "[adam_direction] undefined input array");
  return prim::apply(std::make_shared<AdamDirectionPrimitive>(step), {m, v, p});
}

}  // namespace mt
