#pragma once
// The one path every op takes: check → (sharding rule → redistribution → local kernel) →
// record for autodiff → observe. See docs/architecture.md, "The dispatcher".
#include <functional>
#include <vector>

#include "meshtrain/prim/primitive.h"

namespace mt::prim {

// Applies `p` to `inputs`: infers (and checks) the output; if an input is distributed hands
// the call to the distributed executor; otherwise runs the kernel, records the VJP when an
// input is traced and grad mode is on, and reports the call to the op observer.
Array apply(const PrimitivePtr& p, const std::vector<Array>& inputs);
// apply() for a caller that moved its first input in (add_in_place): when nobody else holds
// it, its storage may take the output, distributed or not (a kernel sees a sole owner).
Array apply_moving_first(const PrimitivePtr& p, std::vector<Array> inputs);

// The distributed layer plugs in here from above: it runs a primitive on global arrays
// (sharding rule, redistribution, then apply() of the localized primitive on the blocks)
// and gathers a global array whole. Installed by dist when the first mesh is made.
class DistributedExecutor {
 public:
  virtual ~DistributedExecutor() = default;
  // `global` is p's output for the global inputs (the dispatcher has already inferred it).
  virtual Array apply(const PrimitivePtr& p, const std::vector<Array>& inputs, const OutputInfo& global) const = 0;
  // apply() whose first input was moved in: the executor may drop its own handles to it, so
  // that a block nobody else holds reaches the kernel as its storage's sole owner.
  virtual Array apply_moving_first(const PrimitivePtr& p, std::vector<Array> inputs, const OutputInfo& global) const {
    return apply(p, inputs, global);
  }
  // The whole value of a distributed array as a plain array on every rank (differentiable).
  virtual Array gather(const Array& x) const = 0;
  // x moved to `spec` on its own mesh (differentiable): for builders that choose which
  // operand to move (an FSDP embedding gathers its ids rather than its table).
  virtual Array redistribute(const Array& x, const layout::PartitionSpec& spec) const = 0;
  // A distributed array's layout and its mesh's axes.
  virtual layout::PartitionSpec spec_of(const Array& x) const = 0;
  virtual layout::MeshShape mesh_shape_of(const Array& x) const = 0;
};
void install_distributed_executor(const DistributedExecutor* executor);
// Null until a mesh exists.
const DistributedExecutor* distributed_executor();

// Model FLOPs (primitives with counts_model_flops: the GEMMs, attention's included) executed
// by this process so far, forward and backward. Trainers log the difference over a step.
double model_flops();
// Adds to that count for kernels a VJP runs directly, outside apply() (a fused backward).
void count_model_flops(double flops);

// Layout queries for builders that pick an algorithm by layout (vocabulary-parallel
// cross-entropy): a plain array is replicated on a mesh without axes.
layout::PartitionSpec spec_of(const Array& x);
layout::MeshShape mesh_shape_of(const Array& x);

// Every kernel call on this process, for profilers and op counters. `seconds` is the
// kernel's wall time (it ended just now); `recorded` says whether a VJP was recorded.
struct OpEvent {
  const Primitive& primitive;
  const std::vector<Array>& inputs;
  const Array& output;
  const OutputInfo& info;
  double seconds;
  bool recorded;
};
using OpObserver = std::function<void(const OpEvent&)>;
// Replaces the observer (an empty function turns observation off); returns the previous one.
OpObserver set_op_observer(OpObserver observer);
// An observer is installed: kernels are then timed to completion, the device queue drained
// around each, which a CUDA-graph capture cannot record (captures wait for the profile's end).
bool observing_ops();

}  // namespace mt::prim
