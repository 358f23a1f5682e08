#pragma once
// Global arrays over a mesh. Every rank runs the same program on global arrays; an array's
// Sharding says which block each rank stores, and the dispatcher inserts the communication
// each primitive's sharding rule requires (layout/rules.h). A one-device mesh never shards
// anything.
#include <string>
#include <vector>

#include "meshtrain/core/array.h"
#include "meshtrain/distributed/sharding.h"

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

// Plugs the distributed layer into the dispatcher (prim::apply runs primitives on global
// arrays through the sharding rules) and into value_and_grad (bucketed gradient reduction).
// Every Mesh calls it; idempotent.
void install_spmd();

}  // namespace mt::dist
