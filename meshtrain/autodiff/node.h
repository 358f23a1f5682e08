#pragma once
// The tape: grad mode, trace depth and the nodes ops record. It sits right above the core so
// that the dispatcher can record; the reverse pass over it is in backward.h.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/core/array.h"

namespace mt::autodiff {

// Cotangents for each input of an op, given the cotangent of its output. An undefined
// Array means "no gradient flows to this input".
using VjpFn = std::function<std::vector<Array>(const Array& cotangent)>;

// One recorded op application. Nodes are created in increasing `id` order, so visiting
// them by decreasing id is a valid reverse topological order.
struct Node {
  uint64_t id = 0;
  const char* op = "";
  std::vector<std::shared_ptr<Node>> inputs;  // node of each op input; null when untraced
  VjpFn vjp;                                  // null for leaves
  // The VJP takes a sharded or partial cotangent as it comes: the output was a global
  // (sharded) array, or the VJP is a collective itself (accept_distributed_cotangent). Any
  // other node receives its cotangent as a plain array: sharded cotangents are gathered first.
  bool takes_distributed_cotangent = false;
};

// Grad mode: when off, ops record nothing (like torch.no_grad).
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// True when grad mode is on and one of `inputs` is traced: the op must record itself.
bool should_record(std::initializer_list<const Array*> inputs);
bool should_record(const std::vector<Array>& inputs);

// Attaches a node to `out` (whose storage the op just computed) when should_record.
// `vjp` must capture what it needs by value and never capture `out` itself
// (use out.detach()), so the graph holds no reference cycle.
void record(Array& out, const char* op, const std::vector<Array>& inputs, VjpFn vjp);

// Marks `out`'s node (if recorded) as taking its cotangent however it is laid out, sharded or
// partial, although `out` itself is plain: for VJPs that are collectives themselves. Without
// it, the gradient of an FSDP parameter gathered to a plain array would be all-reduced whole
// before its VJP could reduce-scatter it.
void accept_distributed_cotangent(Array& out);

// The id the next recorded node will get: nodes recorded from now on have ids >= it.
uint64_t next_node_id();

// How many value_and_grad traces enclose the current code; > 1 means nested.
int trace_depth();
class TraceScope {
 public:
  TraceScope();
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
};

// A traced handle of `x` to differentiate with respect to: a fresh leaf, or an identity
// of `x` when an outer trace already follows x (so outer gradients flow through it).
Array make_leaf(const Array& x);

}  // namespace mt::autodiff
