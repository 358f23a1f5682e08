#include "meshtrain/autodiff/value_and_grad.h"

#include "meshtrain/dist/grad_reducer.h"
#include "meshtrain/dist/spmd.h"
#include "meshtrain/ops/elementwise.h"

namespace mt {
namespace autodiff {

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
  dist::GradReducer reducer;
  auto on_final = [&](size_t i, const Array& g) {
    const Array& primal = *primal_list[i];
    if (!g.defined() || !(dist::is_sharded(g) || dist::is_sharded(primal))) return;
    const dist::Sharding* ps = dist::sharding_of(primal);
    const dist::Mesh& mesh = ps ? ps->mesh : dist::sharding_of(g)->mesh;
    reducer.add(i, g, mesh, ps ? ps->spec.without_partial() : dist::PartitionSpec{});
  };
  std::vector<Array> g = backward(value, seed, targets, nested, nested ? FinalFn() : FinalFn(on_final));
  std::vector<Array> reduced = nested ? std::vector<Array>(g.size()) : reducer.finish(g.size());
  Params grads;
  const std::vector<std::string> paths = primals.paths();
  for (size_t i = 0; i < primal_list.size(); ++i) {
    const Array& primal = *primal_list[i];
    Array gi = reduced[i].defined() ? reduced[i] : g[i];
    if (!gi.defined()) gi = zeros_like(primal);
    if (nested && (dist::is_sharded(gi) || dist::is_sharded(primal))) {
      const dist::Sharding* ps = dist::sharding_of(primal);
      const dist::Mesh& mesh = ps ? ps->mesh : dist::sharding_of(gi)->mesh;
      gi = dist::redistribute(gi, mesh, ps ? ps->spec.without_partial() : dist::PartitionSpec{});
    }
    grads.set(paths[i], gi);
  }
  return grads;
}

void detach_outputs(Array& a) {
  if (a.defined()) a = a.detach();
}

Array resolve_value(const Array& value) {
  // A loss summed over a sharded batch is a partial sum: every rank gets the total.
  if (!dist::is_sharded(value)) return value;
  return dist::redistribute(value, dist::PartitionSpec{});
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
    if (!g[i].defined()) g[i] = Array::zeros(primals[i].shape(), primals[i].dtype());
  if (autodiff::trace_depth() == 1) out = out.detach();
  return {out, g};
}

}  // namespace mt
