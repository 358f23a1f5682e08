#include "meshtrain/autodiff/value_and_grad.h"

#include "meshtrain/autodiff/backward.h"
#include "meshtrain/autodiff/gradient_reduction.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/prim/dispatch.h"

namespace mt {
namespace autodiff {

namespace {
GradientReductionFactory g_reduction_factory;
}  // namespace

void install_gradient_reduction(GradientReductionFactory factory) { g_reduction_factory = std::move(factory); }
std::unique_ptr<GradientReduction> make_gradient_reduction() {
  return g_reduction_factory ? g_reduction_factory() : nullptr;
}

Params make_leaves(const Params& params) {
  Params leaves;
  for (const auto& [path, value] : params) leaves.set(path, make_leaf(value));
  return leaves;
}

Params gradients(const Array& value, const Params& leaves, const Params& primals) {
  MT_CHECK(value.defined() && value.numel() == 1 && is_floating(value.dtype()),
           "[value_and_grad] the function must return a floating scalar, got ",
           value.defined() ? value.str() : "<undefined>");
  std::vector<Array> targets;
  targets.reserve(leaves.size());
  for (const auto& [path, leaf] : leaves) targets.push_back(leaf);
  Array seed = Array::ones(value.shape(), value.dtype());
  std::vector<const Array*> primal_list;
  for (const auto& [path, primal] : primals) primal_list.push_back(&primal);
  // A gradient leaves in its parameter's layout: partial sums over the data axis (data
  // parallelism) are reduced as soon as each gradient is final, in buckets that overlap the
  // rest of the backward pass. Nested traces keep everything differentiable instead.
  const bool nested = trace_depth() > 1;
  std::unique_ptr<GradientReduction> reduction = make_gradient_reduction();
  auto distributed = [](const Array& g, const Array& primal) { return g.distributed() || primal.distributed(); };
  auto on_final = [&](size_t i, const Array& g) {
    if (g.defined() && distributed(g, *primal_list[i])) reduction->add(i, g, *primal_list[i]);
  };
  const bool overlap = !nested && reduction;
  std::vector<Array> g = backward(value, seed, targets, nested, overlap ? FinalFn(on_final) : FinalFn());
  std::vector<Array> reduced = overlap ? reduction->finish(g.size()) : std::vector<Array>(g.size());
  Params grads;
  const std::vector<std::string> paths = primals.paths();
  for (size_t i = 0; i < primal_list.size(); ++i) {
    const Array& primal = *primal_list[i];
    Array gi = reduced[i].defined() ? reduced[i] : g[i];
    if (!gi.defined()) gi = zeros_like(primal);
    if (nested && reduction && distributed(gi, primal)) gi = reduction->to_layout_of(gi, primal);
    grads.set(paths[i], gi);
  }
  return grads;
}

void detach_outputs(Array& a) {
  if (a.defined()) a = a.detach();
}

Array resolve_value(const Array& value) {
  // A loss summed over a sharded batch is a partial sum: every rank gets the total.
  if (!value.distributed()) return value;
  return prim::distributed_executor()->gather(value);
}
void detach_outputs(Params& p) {
  for (auto& [path, a] : p) detach_outputs(a);
}
void detach_outputs(std::vector<Array>& v) {
  for (Array& a : v) detach_outputs(a);
}

}  // namespace autodiff

Array stop_gradient(const Array& x) { return x.detach(); }

std::pair<Array, std::vector<Array>> vjp(const std::function<Array(const std::vector<Array>&)>& f,
                                         const std::vector<Array>& primals, const Array& cotangent) {
  autodiff::TraceScope scope;
  autodiff::EnableGradGuard grad_on;
  std::vector<Array> leaves;
  for (const Array& p : primals) leaves.push_back(autodiff::make_leaf(p));
  Array out = f(leaves);
  MT_CHECK(out.shape() == cotangent.shape(), "[vjp] cotangent shape ", cotangent.shape().str(),
           " differs from output shape ", out.shape().str());
  std::vector<Array> g = autodiff::backward(out, cotangent, leaves, autodiff::trace_depth() > 1);
  for (size_t i = 0; i < g.size(); ++i)
    if (!g[i].defined()) g[i] = Array::full(primals[i].shape(), 0.0, primals[i].dtype(), primals[i].device());
  if (autodiff::trace_depth() == 1) out = out.detach();
  return {out, g};
}

}  // namespace mt
