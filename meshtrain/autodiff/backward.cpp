#include "meshtrain/autodiff/backward.h"

#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "meshtrain/core/device.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/trace.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/prim/dispatch.h"

namespace mt::autodiff {

namespace {
// Marks nodes from which some target is reachable; only those need cotangents.
void mark_needed(Node* root, const std::unordered_set<Node*>& targets, std::unordered_map<Node*, bool>& needed) {
  // Iterative post-order DFS: graphs of deep models overflow a recursive walk.
  struct Frame {
    Node* node;
    size_t next_input;
  };
  std::vector<Frame> stack{{root, 0}};
  needed[root] = targets.count(root) > 0;
  while (!stack.empty()) {
    Frame& f = stack.back();
    Node* node = f.node;
    if (targets.count(node) || f.next_input >= node->inputs.size()) {
      stack.pop_back();
      if (!stack.empty() && needed[node]) needed[stack.back().node] = true;
      continue;
    }
    Node* child = node->inputs[f.next_input++].get();
    if (!child) continue;
    auto it = needed.find(child);
    if (it != needed.end()) {
      if (it->second) needed[node] = true;
      continue;
    }
    needed[child] = targets.count(child) > 0;
    stack.push_back({child, 0});
  }
}
}  // namespace

std::vector<Array> backward(const Array& output, const Array& cotangent, const std::vector<Array>& targets,
                            bool create_graph, const FinalFn& on_final) {
  std::vector<Array> result(targets.size());
  std::unordered_map<Node*, std::vector<size_t>> target_index;
  for (size_t i = 0; i < targets.size(); ++i) target_index[targets[i].impl()->node.get()].push_back(i);
  std::vector<bool> reported(targets.size(), false);
  auto report = [&](Node* t, const Array& g) {
    if (!on_final) return;
    for (size_t i : target_index[t])
      if (!reported[i]) {
        reported[i] = true;
        on_final(i, g);
      }
  };
  if (!output.traced()) {
    for (size_t i = 0; i < targets.size(); ++i) report(targets[i].impl()->node.get(), Array());
    return result;
  }
  std::unordered_set<Node*> target_nodes;
  for (const Array& t : targets) target_nodes.insert(t.impl()->node.get());

  Node* root = output.impl()->node.get();
  std::unordered_map<Node*, bool> needed;
  mark_needed(root, target_nodes, needed);
  // Edges still to deliver into each target: when they reach zero its cotangent is final.
  std::unordered_map<Node*, int> pending;
  if (on_final)
    for (const auto& [node, need] : needed)
      if (need && !target_nodes.count(node))
        for (const auto& in : node->inputs)
          if (in && target_nodes.count(in.get())) ++pending[in.get()];

  std::unique_ptr<NoGradGuard> no_grad;
  std::unique_ptr<EnableGradGuard> with_grad;
  if (create_graph) with_grad = std::make_unique<EnableGradGuard>();
  else no_grad = std::make_unique<NoGradGuard>();

  std::unordered_map<Node*, Array> cotangents;
  // A second cotangent for the same node is summed into the first one's storage when nothing
  // else holds it (a first-order pass): tied weights then hold one whole gradient, not three.
  auto accumulate = [create_graph](Array sum, Array more) {
    return create_graph ? add(sum, more) : add_in_place(std::move(sum), more);
  };
  auto by_id = [](Node* a, Node* b) { return a->id < b->id; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(by_id)> ready(by_id);
  if (needed[root]) {
    cotangents[root] = cotangent;
    ready.push(root);
  }
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    if (target_nodes.count(node) || !node->vjp) continue;
    Array g = cotangents[node];
    if (!create_graph) cotangents.erase(node);
    // Sharded consumers of a plain (replicated) value hand back partial or split cotangents;
    // the plain op's VJP (kernels included) needs the whole value.
    if (!node->takes_distributed_cotangent && g.distributed()) g = prim::distributed_executor()->gather(g);
    std::optional<trace::Span> span;  // the VJP's span, named after its forward op
    if (trace::enabled()) span.emplace("vjp", node->op);
    std::vector<Array> input_grads = node->vjp(g);
    // Profiled ops are timed to completion; a VJP's own kernels (a fused backward launched
    // directly) are too, so its self time is theirs and not the next op's wait.
    if (span && prim::observing_ops() && g.defined()) synchronize(g.device());
    span.reset();
    // The node's cotangent is spent: freed before its inputs' cotangents are summed, not
    // after (an embedding's whole-table gradient would otherwise sit beside their sum).
    g = Array();
    MT_CHECK(input_grads.size() == node->inputs.size(), "[backward] vjp of ", node->op, " returned ",
             input_grads.size(), " cotangents for ", node->inputs.size(), " inputs");
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      Node* in = node->inputs[i].get();
      if (on_final && in && target_nodes.count(in)) {
        // Delivered (or not) either way: count the edge, then report once all are in.
        if (input_grads[i].defined()) {
          auto it = cotangents.find(in);
          if (it == cotangents.end()) cotangents.emplace(in, std::move(input_grads[i]));
          else it->second = accumulate(std::move(it->second), std::move(input_grads[i]));
        }
        if (--pending[in] == 0) {
          auto it = cotangents.find(in);
          report(in, it == cotangents.end() ? Array() : it->second);
        }
        continue;
      }
      if (!in || !input_grads[i].defined()) continue;
      auto need = needed.find(in);
      if (need == needed.end() || !need->second) continue;
      auto it = cotangents.find(in);
      if (it == cotangents.end()) {
        cotangents.emplace(in, std::move(input_grads[i]));
        ready.push(in);
      } else {
        it->second = accumulate(std::move(it->second), std::move(input_grads[i]));
      }
    }
    // A first-order pass runs once over its graph: drop saved tensors as soon as possible.
    if (!create_graph && trace_depth() <= 1) node->vjp = nullptr;
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    auto it = cotangents.find(targets[i].impl()->node.get());
    if (it != cotangents.end()) result[i] = it->second;
    report(targets[i].impl()->node.get(), result[i]);  // targets whose consumers never ran
  }
  return result;
}

}  // namespace mt::autodiff
