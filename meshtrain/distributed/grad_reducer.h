#pragma once
// Data-parallel gradient reduction overlapped with the backward pass. As soon as a
// parameter's gradient is final the backward pass hands it here; gradients that are partial
// sums over one mesh axis are packed into ~32 MiB buckets, and each full bucket's all-reduce
// starts asynchronously while the backward pass goes on. Other layout changes (FSDP's
// reduce-scatter, ...) run through redistribute when the pass is done.
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/distributed/collective_ops.h"
#include "meshtrain/distributed/comm_handle.h"
#include "meshtrain/distributed/spmd.h"

namespace mt::dist {

// Bucket size used by value_and_grad (default 32 MiB); settable for tuning and tests.
size_t grad_bucket_bytes();
void set_grad_bucket_bytes(size_t bytes);

// The dtype f32 gradients travel in between data-parallel ranks (--grad-reduce-dtype): f32
// (the default: an all-reduce), or bf16, half the bytes, still summed at least in f32 (the CPU
// sums in double): each bucket of gradients partial over the mesh's `data` axis is rounded to
// bf16 once, exchanged all-to-all so that each rank holds every rank's copy of one slice,
// summed there in rank order and rounded once more, and the slices all-gathered (bf16). So the
// result is bf16(Σ_r bf16(g_r)) on every rank whatever their number, where a bf16 all-reduce
// would round each partial sum of its ring. FSDP's weight gradients, reduce-scattered in the
// backward by the VJP of the weight's gather (spmd.cpp), go bf16 too: each rank keeps
// Σ_r bf16(g_r) of its block in f32 (reduce_scatter_dim_bf16), as PyTorch FSDP's reduce_dtype,
// whether the gather makes the weight whole (a `data`-only mesh) or keeps its `model` split.
// Tensor-parallel partial sums (other axes) stay f32. Process-wide. Other dtypes are an error.
DType grad_reduce_dtype();
void set_grad_reduce_dtype(DType dtype);

// What the last finished reduction did: buckets issued in all, and how many of them started
// before the backward pass ended (the overlap).
struct GradReductionStats {
  int buckets = 0;
  int buckets_during_backward = 0;
};
GradReductionStats last_grad_reduction();

// Makes value_and_grad reduce gradients with a GradReducer (called by install_spmd).
void install_gradient_reduction();

class GradReducer {
 public:
  explicit GradReducer(size_t bucket_bytes = grad_bucket_bytes()) : bucket_bytes_(bucket_bytes) {}
  // Gradient `index` is final: bring it to `target` on `mesh`.
  void add(size_t index, const Array& grad, const Mesh& mesh, const PartitionSpec& target);
  // Waits for every reduction; the reduced gradients by index (undefined where none was added).
  std::vector<Array> finish(size_t count);
  // How many bucket all-reduces were issued (for tests and logs).
  int buckets_issued() const { return buckets_issued_; }

 private:
  struct Entry {
    size_t index;
    Array local;  // this rank's block, reduced in place by the bucket's all-reduce
    Sharding target;
    Shape global;
  };
  struct Bucket {
    std::string axis;  // the mesh axis the bucket's gradients are partial over
    Communicator* comm = nullptr;
    DType dtype = DType::f32;
    std::vector<Entry> entries;
    size_t bytes = 0;
    Array buffer;
    CommHandle handle;
    // bf16 on the wire (grad_reduce_dtype): the bucket, padded to ranks × slice elements,
    // reduce-scattered in bf16 on `wire` (then rounded once and all-gathered).
    std::optional<Bf16ReduceScatter> narrow;
    Communicator* wire = nullptr;
    int64_t slice = 0;
  };
  void launch(Bucket& bucket);
  // A narrow bucket once its exchange is done: its reduced values, f32, in the wire's memory.
  static Array sum_narrow(Bucket& bucket);

  size_t bucket_bytes_;
  std::map<std::pair<std::string, int>, Bucket> open_;  // (axis, dtype) -> filling bucket
  std::vector<Bucket> in_flight_;
  std::vector<std::pair<size_t, Array>> done_;
  int buckets_issued_ = 0;
};

}  // namespace mt::dist
