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
// The same for f32 `local` with half the bytes on the wire: every rank's blocks rounded to bf16
// once and exchanged all-to-all, and this rank's block summed over the ranks in rank order in
// f32 or wider, not rounded again: Σ_r bf16(x_r). FSDP's weight gradients under
// --grad-reduce-dtype bf16 (as PyTorch FSDP's reduce_dtype).
Array reduce_scatter_dim_bf16(const Array& local, int d, Communicator& comm);
// The sum over the ranks of `comm` (a new array; x is not modified).
Array all_reduce_sum(const Array& local, Communicator& comm);

// Differentiable versions over a mesh axis.
Array all_gather(const Array& local, const Mesh& mesh, const std::string& axis, int dim);
Array reduce_scatter(const Array& local, const Mesh& mesh, const std::string& axis, int dim);
Array all_reduce(const Array& local, const Mesh& mesh, const std::string& axis);

}  // namespace mt::dist
