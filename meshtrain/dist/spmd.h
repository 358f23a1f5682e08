#pragma once
// Global arrays over a mesh. Every rank runs the same program on global arrays; an array's
// Sharding says which block each rank stores, and ops insert the communication their
// inputs' shardings require (see rules.h). A one-device mesh never shards anything.
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/core/array.h"
#include "meshtrain/dist/sharding.h"

namespace mt::dist {

// True when x is distributed over more than one rank (a non-trivial layout).
bool is_sharded(const Array& x);
// x's sharding, or null for an ordinary (replicated, undistributed) array.
const Sharding* sharding_of(const Array& x);

// Every rank passes the same full host array and keeps its block. `what` names the array in
// errors (indivisible dims, unknown axes).
Array shard(const Array& host, const Sharding& sharding, const std::string& what = "array");
Array shard(const Array& host, const Mesh& mesh, const PartitionSpec& spec, const std::string& what = "array");
// The full value on every rank (gathers blocks, sums partials); x itself when not sharded.
Array to_host(const Array& x);

// Differentiable moves between layouts. redistribute inserts the cheapest collectives it
// knows for the change (all_reduce, reduce_scatter, all_gather, local slicing).
Array redistribute(const Array& x, const Mesh& mesh, const PartitionSpec& to);
Array redistribute(const Array& x, const PartitionSpec& to);  // x must be sharded (its mesh)
// Pins x to `spec` on `mesh` (like jax.lax.with_sharding_constraint); validates the spec.
Array with_sharding_constraint(const Array& x, const Mesh& mesh, const PartitionSpec& spec,
                               const std::string& what = "array");

// This rank's block as an ordinary array, and back. Both differentiable; the cotangent of a
// partial-sum array is replicated (each rank's partial contributes with weight one).
Array local_view(const Array& x);
Array global_view(const Array& local, const Sharding& sharding);

// An array of `value` laid out like a (without its partial sums).
Array full_like(const Array& a, double value);

// ---- op dispatch ---------------------------------------------------------------------
struct ArgInfo {
  Shape shape;  // global
  PartitionSpec spec;
  DType dtype;
  bool defined = true;
};
struct RuleResult {
  std::vector<PartitionSpec> inputs;  // the layout each input must be brought to
  PartitionSpec output;
};
// A sharding rule: from the inputs' layouts, the layouts to compute in (inserting
// redistributions where they differ) and the resulting output layout.
using Rule = std::function<RuleResult(const std::vector<ArgInfo>&, const Mesh&)>;
using LocalFn = std::function<Array(const std::vector<Array>&)>;
// For ops whose local computation needs the output layout (e.g. the local target shape).
using LocalFnWithLayout = std::function<Array(const std::vector<Array>&, const Sharding& out)>;

bool any_sharded(const std::vector<Array>& inputs);
// Runs `local_fn` on the inputs' local blocks after redistributing them as `rule` says;
// undefined inputs pass through as undefined.
Array spmd_call(const char* op, const std::vector<Array>& inputs, const Rule& rule, const LocalFn& local_fn);
Array spmd_call(const char* op, const std::vector<Array>& inputs, const Rule& rule, const LocalFnWithLayout& local_fn);

}  // namespace mt::dist
