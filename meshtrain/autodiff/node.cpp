#include "meshtrain/autodiff/node.h"

#include <atomic>

#include "meshtrain/core/error.h"

namespace mt::autodiff {

namespace {
thread_local bool g_grad_enabled = true;
thread_local int g_trace_depth = 0;
std::atomic<uint64_t> g_next_node_id{1};
}  // namespace

bool grad_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }
EnableGradGuard::EnableGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { g_grad_enabled = previous_; }

uint64_t next_node_id() { return g_next_node_id.load(); }

int trace_depth() { return g_trace_depth; }
TraceScope::TraceScope() { ++g_trace_depth; }
TraceScope::~TraceScope() { --g_trace_depth; }

bool should_record(std::initializer_list<const Array*> inputs) {
  if (!g_grad_enabled) return false;
  for (const Array* a : inputs)
    if (a->defined() && a->traced()) return true;
  return false;
}

bool should_record(const std::vector<Array>& inputs) {
  if (!g_grad_enabled) return false;
  for (const Array& a : inputs)
    if (a.defined() && a.traced()) return true;
  return false;
}

void record(Array& out, const char* op, const std::vector<Array>& inputs, VjpFn vjp) {
  if (!should_record(inputs)) return;
  auto node = std::make_shared<Node>();
  node->id = g_next_node_id++;
  node->op = op;
  node->inputs.reserve(inputs.size());
  for (const Array& a : inputs) node->inputs.push_back(a.defined() ? a.impl()->node : nullptr);
  node->vjp = std::move(vjp);
  node->takes_distributed_cotangent = out.sharded();
  out.impl()->node = std::move(node);
}

void accept_distributed_cotangent(Array& out) {
  if (out.defined() && out.impl()->node) out.impl()->node->takes_distributed_cotangent = true;
}

Array make_leaf(const Array& x) {
  MT_CHECK(x.defined(), "[value_and_grad] cannot differentiate with respect to an undefined array");
  Array leaf = x.detach();
  auto node = std::make_shared<Node>();
  node->id = g_next_node_id++;
  node->op = "leaf";
  if (g_grad_enabled && x.traced()) {
    node->inputs.push_back(x.impl()->node);
    node->vjp = [](const Array& g) { return std::vector<Array>{g}; };
  }
  node->takes_distributed_cotangent = leaf.sharded();
  leaf.impl()->node = std::move(node);
  return leaf;
}

}  // namespace mt::autodiff
