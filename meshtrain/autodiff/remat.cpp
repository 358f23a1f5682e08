#include "meshtrain/autodiff/remat.h"

#include <unordered_set>

#include "meshtrain/autodiff/backward.h"
#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"

namespace mt {

namespace {

// Fails when the recomputed graph reaches a node recorded before the rerun's own leaves:
// f read a traced array that was not among its inputs, and its gradient would be lost.
void check_closed(const Array& out, uint64_t first_id) {
  std::vector<autodiff::Node*> stack{out.impl()->node.get()};
  std::unordered_set<autodiff::Node*> seen;
  while (!stack.empty()) {
    autodiff::Node* n = stack.back();
    stack.pop_back();
    if (!n || !seen.insert(n).second) continue;
    MT_CHECK(n->id >= first_id, "[checkpoint] the function reads a traced array (made by '", n->op,
             "') that is not among its params or inputs; pass it in, or its gradient would be lost");
    for (const auto& in : n->inputs) stack.push_back(in.get());
  }
}

}  // namespace

Array checkpoint(const CheckpointFn& f, const Params& params, const std::vector<Array>& inputs) {
  std::vector<Array> all;  // params then inputs: the recorded node's inputs
  all.reserve(params.size() + inputs.size());
  for (const auto& [path, value] : params) all.push_back(value);
  for (const Array& x : inputs) all.push_back(x);
  if (!autodiff::should_record(all) || autodiff::trace_depth() > 1) return f(params, inputs);

  Array out;
  {
    autodiff::NoGradGuard no_grad;
    out = f(params, inputs);
  }
  MT_CHECK(out.defined(), "[checkpoint] the function returned an undefined array");
  // Only the inputs are kept (detached: the node's inputs already link the graph).
  Params saved_params;
  for (const auto& [path, value] : params) saved_params.set(path, value.detach());
  std::vector<Array> saved_inputs;
  for (const Array& x : inputs) saved_inputs.push_back(x.defined() ? x.detach() : Array());
  autodiff::record(out, "checkpoint", all, [f, saved_params, saved_inputs](const Array& g) {
    autodiff::EnableGradGuard grad_on;
    const uint64_t first_id = autodiff::next_node_id();
    Params leaf_params;
    std::vector<Array> leaves;
    for (const auto& [path, value] : saved_params) {
      leaf_params.set(path, autodiff::make_leaf(value));
      leaves.push_back(leaf_params.at(path));
    }
    std::vector<Array> leaf_inputs;
    for (const Array& x : saved_inputs) {
      leaf_inputs.push_back(x.defined() ? autodiff::make_leaf(x) : Array());
      if (x.defined()) leaves.push_back(leaf_inputs.back());
    }
    Array y = f(leaf_params, leaf_inputs);
    std::vector<Array> grads(saved_params.size() + saved_inputs.size());
    if (!y.traced()) return grads;  // f ignored everything traced: no gradient flows
    check_closed(y, first_id);
    std::vector<Array> leaf_grads = autodiff::backward(y, g, leaves, false);
    size_t k = 0;
    for (size_t i = 0; i < saved_params.size(); ++i) grads[i] = leaf_grads[k++];
    for (size_t i = 0; i < saved_inputs.size(); ++i)
      if (saved_inputs[i].defined()) grads[saved_params.size() + i] = leaf_grads[k++];
    return grads;
  });
  return out;
}

Remat parse_remat(const std::string& name) {
  if (name == "none") return Remat::none;
  if (name == "block") return Remat::block;
  if (name == "full") return Remat::full;
  throw Error(detail::concat("[remat] unknown policy '", name, "': use none, block or full"));
}

const char* remat_name(Remat r) {
  switch (r) {
    case Remat::none: return "none";
    case Remat::block: return "block";
    case Remat::full: return "full";
  }
  return "?";
}

}  // namespace mt
