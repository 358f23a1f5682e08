#include "meshtrain/prim/dispatch.h"

#include <atomic>
#include <chrono>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"

namespace mt::prim {

namespace {

const DistributedExecutor* g_executor = nullptr;
OpObserver g_observer;
// Kernels run on the training thread, but data-loader threads may apply ops too.
std::atomic<double> g_model_flops{0};

bool any_distributed(const std::vector<Array>& inputs) {
  for (const Array& a : inputs)
    if (a.defined() && a.distributed()) return true;
  return false;
}

// The device every defined input sits on (the current device for an op without inputs); an
// op mixing devices is an error naming both, never a silent copy.
Device device_of(const Primitive& p, const std::vector<Array>& inputs) {
  const Array* first = nullptr;
  for (const Array& a : inputs) {
    if (!a.defined()) continue;
    if (!first) {
      first = &a;
      continue;
    }
    MT_CHECK(a.device() == first->device(), "[", p.name(), "] inputs on different devices: ", first->str(), " on ",
             first->device().str(), " and ", a.str(), " on ", a.device().str(), " (move one with Array::to)");
  }
  return first ? first->device() : current_device();
}

// The VJP closure keeps only what the primitive asked for; shapes and dtypes always.
autodiff::VjpFn make_vjp(const PrimitivePtr& p, const std::vector<Array>& inputs, const Array& out,
                         std::vector<Array>&& aux) {
  auto saved = std::make_shared<Saved>();
  saved->primitive = p;
  const uint32_t keep = p->keeps_inputs();
  saved->inputs.resize(inputs.size());
  saved->shapes.reserve(inputs.size());
  saved->dtypes.reserve(inputs.size());
  saved->traced.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Array& a = inputs[i];
    if (a.defined() && i < 32 && (keep >> i & 1u)) saved->inputs[i] = a;
    saved->shapes.push_back(a.defined() ? a.shape() : Shape{});
    saved->dtypes.push_back(a.defined() ? a.dtype() : DType::f32);
    saved->traced.push_back(a.defined() && a.traced());
  }
  if (p->keeps_output()) saved->output = out.detach();
  saved->aux = std::move(aux);
  return [saved](const Array& g) { return saved->primitive->vjp(*saved, g); };
}

}  // namespace

Array apply(const PrimitivePtr& p, const std::vector<Array>& inputs) {
  if (any_distributed(inputs)) {
    const OutputInfo global = p->infer(inputs);  // global checks first, with global shapes in the messages
    MT_CHECK(g_executor, "[", p->name(), "] distributed input but no distributed executor installed");
    return g_executor->apply(p, inputs, global);
  }
  const OutputInfo info = p->infer(inputs);
  std::vector<Array> aux;
  Array out;
  std::chrono::steady_clock::time_point t0;
  const Device device = device_of(*p, inputs);
  // Observed GPU kernels are timed to completion (the queue drained before and after), so
  // profiles show each kernel's time rather than its enqueue; unobserved runs stay async.
  if (g_observer) {
    synchronize(device);
    t0 = std::chrono::steady_clock::now();
  }
  {
    // Kernels allocate with Array::empty: their outputs land on their inputs' device.
    DeviceScope scope(device);
    out = p->run(inputs, info, aux);
  }
  if (g_observer) synchronize(device);
  if (p->counts_model_flops()) g_model_flops.fetch_add(p->cost(inputs, info).flops, std::memory_order_relaxed);
  double seconds = 0;
  if (g_observer) seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool recorded = autodiff::should_record(inputs) && p->differentiable(inputs, info);
  if (recorded) {
    for (const Array& a : inputs)
      MT_CHECK(!a.defined() || a.impl() != out.impl(), "[", p->name(), "] kernel returned its input handle");
    autodiff::record(out, p->name(), inputs, make_vjp(p, inputs, out, std::move(aux)));
  }
  if (g_observer) g_observer(OpEvent{*p, inputs, out, info, seconds, recorded});
  return out;
}

Array apply_moving_first(const PrimitivePtr& p, std::vector<Array> inputs) {
  if (!any_distributed(inputs)) return prim::apply(p, inputs);  // inputs[0]: still the only handle
  const OutputInfo global = p->infer(inputs);
  MT_CHECK(g_executor, "[", p->name(), "] distributed input but no distributed executor installed");
  return g_executor->apply_moving_first(p, std::move(inputs), global);
}

double model_flops() { return g_model_flops.load(std::memory_order_relaxed); }
void count_model_flops(double flops) { g_model_flops.fetch_add(flops, std::memory_order_relaxed); }

void install_distributed_executor(const DistributedExecutor* executor) { g_executor = executor; }
const DistributedExecutor* distributed_executor() { return g_executor; }

layout::PartitionSpec spec_of(const Array& x) {
  return x.defined() && x.distributed() ? g_executor->spec_of(x) : layout::PartitionSpec{};
}
layout::MeshShape mesh_shape_of(const Array& x) {
  return x.defined() && x.distributed() ? g_executor->mesh_shape_of(x) : layout::MeshShape{};
}

bool observing_ops() { return bool(g_observer); }

OpObserver set_op_observer(OpObserver observer) {
  OpObserver previous = std::move(g_observer);
  g_observer = std::move(observer);
  return previous;
}

}  // namespace mt::prim
