#include "meshtrain/ops/random.h"

#include <cmath>

#include "meshtrain/backend/random.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/core/error.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("random", {"dropout"});

using Grads = std::vector<Array>;

namespace {
void check_shape(const Shape& shape, const char* op) {
  for (int64_t d : shape) MT_CHECK(d >= 0, "[", op, "] negative dimension in shape ", shape.str());
}
}  // namespace

Array random_uniform(const RngKey& key, const Shape& shape, DType dtype, double lo, double hi) {
  check_shape(shape, "random_uniform");
  MT_CHECK(is_floating(dtype), "[random_uniform] dtype must be floating, got ", dtype_name(dtype));
  MT_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "[random_uniform] need finite lo <= hi, got [", lo, ", ",
           hi, ")");
  // Drawn on the host whatever the device: initial values are then the same bits on every
  // device (a one-time cost; dropout, drawn every step, has its own GPU kernel).
  Array out = Array::empty(shape, dtype, Device::cpu());
  cpu::random_uniform(key.host_resolved(), out, lo, hi);
  return out.to(current_device());
}

Array random_normal(const RngKey& key, const Shape& shape, DType dtype, double mean, double std) {
  check_shape(shape, "random_normal");
  MT_CHECK(is_floating(dtype), "[random_normal] dtype must be floating, got ", dtype_name(dtype));
  MT_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0,
           "[random_normal] need finite mean and std >= 0, got mean ", mean, " std ", std);
  Array out = Array::empty(shape, dtype, Device::cpu());
  cpu::random_normal(key.host_resolved(), out, mean, std);
  return out.to(current_device());
}

Array bernoulli(const RngKey& key, const Shape& shape, double p) {
  check_shape(shape, "bernoulli");
  MT_CHECK(p >= 0.0 && p <= 1.0, "[bernoulli] probability ", p, " outside [0, 1]");
  Array out = Array::empty(shape, DType::boolean, Device::cpu());
  cpu::bernoulli(key.host_resolved(), out, p);
  return out.to(current_device());
}

namespace {

// Inverted dropout with the mask drawn from `key` at each element's global position, so a
// block of a distributed array masks exactly like the whole array would. Linear in x: its
// VJP is itself (the same mask).
class DropoutPrimitive final : public prim::Primitive {
 public:
  DropoutPrimitive(double rate, RngKey key, kernels::StreamBlock block = {})
      : rate_(rate), key_(key), block_(std::move(block)) {}
  const char* name() const override { return "dropout"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override { return {in[0].shape(), in[0].dtype()}; }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, dropout, in[0], out, key_, rate_, block_);
    return out;
  }
  uint32_t keeps_inputs() const override { return 0; }
  Grads vjp(const prim::Saved& s, const Array& g) const override { return {prim::apply(s.primitive, {g})}; }
  // The mask depends only on position, so any layout (partial sums included) is kept.
  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape& mesh) const override {
    return layout::rules::gather_dims(in, mesh, {}, true);
  }
  prim::PrimitivePtr localize(const prim::LocalContext& ctx, const prim::PrimitivePtr&) const override {
    return std::make_shared<DropoutPrimitive>(rate_, key_, kernels::StreamBlock{ctx.input_global[0].dims(), ctx.input_offsets[0]});
  }

 private:
  double rate_;
  RngKey key_;
  kernels::StreamBlock block_;
};

}  // namespace

Array dropout(const Array& x, double rate, const RngKey& key, bool train) {
  MT_CHECK(x.defined(), "[dropout] undefined input array");
  MT_CHECK(is_floating(x.dtype()), "[dropout] expects a floating array, got ", x.str());
  MT_CHECK(rate >= 0.0 && rate <= 1.0, "[dropout] rate ", rate, " outside [0, 1] for ", x.str());
  if (!train || rate == 0.0) return x;
  return prim::apply(std::make_shared<DropoutPrimitive>(rate, key), {x});
}

}  // namespace mt
