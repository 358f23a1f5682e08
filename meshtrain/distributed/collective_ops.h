#pragma once
// Collectives on local blocks, along one mesh axis's communicator. The raw forms move data
// only; redistribute (spmd.h) is built from them. The differentiable forms record VJPs
// following DESIGN.md §3, for the two ways they are used:
//  - all_gather ↔ reduce_scatter: the gathered value feeds per-rank work (FSDP: each rank's
//    loss covers its own data), so each rank's cotangent is a partial contribution and the
//    contributions to this rank's block are summed;
//  - all_reduce ↔ identity: the reduced value is replicated and the loss counted once
//    (tensor parallelism), so each rank's partial input receives the cotangent as is.
#include "meshtrain/core/array.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/distributed/mesh.h"

namespace mt::dist {

// (..., n, ...) blocks of the ranks of `comm` concatenated along dim d in rank order.
Array all_gather_dim(const Array& local, int d, Communicator& comm);
// The sum over the ranks of `comm`, keeping this rank's block along dim d (n / size).
Array reduce_scatter_dim(const Array& local, int d, Communicator& comm);
// A reduce-scatter of f32 values with half the bytes on the wire, started: `blocks` (one per
// rank, rank-major: ranks × count elements, any shape) rounded to bf16 once where they are,
// moved to `where` (the communicator's memory: the host for MPI, the GPU for NCCL) and
// exchanged all-to-all. finish() waits and returns this rank's block, (count,) f32, summed over
// the ranks in rank order in f32 or wider, not rounded again: Σ_r bf16(x_r). Bucketed
// data-parallel gradients (grad_reducer.cpp) and FSDP's (reduce_scatter_dim_bf16) under
// --grad-reduce-dtype bf16.
class Bf16ReduceScatter {
 public:
  Bf16ReduceScatter(const Array& blocks, Communicator& comm, Device where);
  Array finish();

 private:
  int ranks_;
  Array sent_, received_;
  CommHandle handle_;
};
// reduce_scatter_dim for f32 `local` through a Bf16ReduceScatter: this rank's block of
// Σ_r bf16(x_r) along dim d. FSDP's weight gradients under --grad-reduce-dtype bf16 (as
// PyTorch FSDP's reduce_dtype).
Array reduce_scatter_dim_bf16(const Array& local, int d, Communicator& comm);
// The sum over the ranks of `comm` (a new array; x is not modified).
Array all_reduce_sum(const Array& local, Communicator& comm);

// Differentiable versions over a mesh axis.
Array all_gather(const Array& local, const Mesh& mesh, const std::string& axis, int dim);
Array reduce_scatter(const Array& local, const Mesh& mesh, const std::string& axis, int dim);
Array all_reduce(const Array& local, const Mesh& mesh, const std::string& axis);

}  // namespace mt::dist
