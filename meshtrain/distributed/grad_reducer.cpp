#include "meshtrain/distributed/grad_reducer.h"

#include <cstring>

#include "meshtrain/autodiff/gradient_reduction.h"
#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"

namespace mt::dist {

namespace {
size_t g_bucket_bytes = size_t(32) << 20;
DType g_reduce_dtype = DType::f32;
GradReductionStats g_last_stats;
}  // namespace

size_t grad_bucket_bytes() { return g_bucket_bytes; }
void set_grad_bucket_bytes(size_t bytes) { g_bucket_bytes = bytes > 0 ? bytes : 1; }
DType grad_reduce_dtype() { return g_reduce_dtype; }
void set_grad_reduce_dtype(DType dtype) {
  MT_CHECK(dtype == DType::f32 || dtype == DType::bf16, "[grad reduce] gradients travel in f32 or bf16, not ",
           dtype_name(dtype));
  g_reduce_dtype = dtype;
}
GradReductionStats last_grad_reduction() { return g_last_stats; }

void GradReducer::add(size_t index, const Array& grad, const Mesh& mesh, const PartitionSpec& target) {
  const Sharding* gs = sharding_of(grad);
  // The bucketable case: the same blocks, partial over exactly one axis -> an all-reduce.
  if (gs && is_sharded(grad) && gs->spec.partial.size() == 1 && gs->spec.without_partial() == target &&
      gs->mesh == mesh) {
    const std::string& axis = gs->spec.partial[0];
    Bucket& b = open_[{axis, int(grad.dtype())}];
    b.axis = axis;
    b.comm = &mesh.axis_comm(axis);
    b.dtype = grad.dtype();
    Array local = local_view(grad.detach());
    b.entries.push_back({index, local, Sharding{mesh, target}, grad.shape()});
    b.bytes += local.nbytes();
    if (b.bytes >= bucket_bytes_) {
      launch(b);
      open_.erase({axis, int(grad.dtype())});
    }
    return;
  }
  done_.emplace_back(index, redistribute(grad, mesh, target));
}

void GradReducer::launch(Bucket& b) {
  int64_t elements = 0;
  for (const Entry& e : b.entries) elements += e.local.numel();
  // GPU gradients reduce in device memory where the ranks have a device communicator (NCCL);
  // otherwise MPI reduces host memory. (Asked whatever the device: the first ask is a
  // collective every rank makes.)
  const Device device = b.entries.front().local.device();
  Communicator* device_comm = b.comm->device_communicator(device);
  if (!device.is_cuda()) device_comm = nullptr;
  const Device where = device_comm ? device : Device::cpu();
  const int ranks = b.comm->size();
  // Only the data axis's sums (data parallelism); a model axis's partial sums (tensor
  // parallelism) stay f32.
  const bool narrow = g_reduce_dtype == DType::bf16 && b.dtype == DType::f32 && ranks > 1 && b.axis == "data";
  b.slice = (elements + ranks - 1) / ranks;
  if (narrow) elements = b.slice * ranks;  // the tail zeroed below
  b.buffer = Array::empty({elements}, b.dtype, where);
  char* dst = static_cast<char*>(b.buffer.raw());
  for (const Entry& e : b.entries) {
    if (device_comm) {
      cuda_runtime().copy_on_device(dst, e.local.raw(), e.local.nbytes());
    } else {
      const Array host = e.local.to(Device::cpu());
      std::memcpy(dst, host.raw(), e.local.nbytes());
    }
    dst += e.local.nbytes();
  }
  Communicator* comm = device_comm ? device_comm : b.comm;
  if (narrow) {
    const size_t filled = size_t(dst - static_cast<char*>(b.buffer.raw())), all = b.buffer.nbytes();
    if (filled < all) {
      const uint8_t zero = 0;
      if (device_comm)
        cuda_runtime().fill_bytes(dst, &zero, 1, all - filled);
      else
        std::memset(dst, 0, all - filled);
    }
    b.narrow.emplace(b.buffer, *comm, where);
    b.wire = comm;
    b.buffer = Array();
  } else {
    b.handle = comm->all_reduce_async(b.buffer.raw(), elements, b.dtype, ReduceOp::sum);
  }
  ++buckets_issued_;
  in_flight_.push_back(std::move(b));
}

Array GradReducer::sum_narrow(Bucket& b) {
  autodiff::NoGradGuard no_grad;
  // This rank's slice summed, rounded once; every rank does the same for its own slice.
  const Array mine = cast(b.narrow->finish(), DType::bf16);
  b.narrow.reset();
  Array gathered = Array::empty({int64_t(b.wire->size()) * b.slice}, DType::bf16, mine.device());
  b.wire->all_gather(mine.raw(), gathered.raw(), b.slice, DType::bf16);
  return cast(gathered, DType::f32);
}

std::vector<Array> GradReducer::finish(size_t count) {
  const int during_backward = buckets_issued_;
  for (auto& [key, bucket] : open_) launch(bucket);
  open_.clear();
  std::vector<Array> out(count);
  for (auto& [index, g] : done_) out[index] = g;
  for (Bucket& b : in_flight_) {
    if (b.narrow)
      b.buffer = sum_narrow(b);
    else
      b.handle.wait();
    const char* src = static_cast<const char*>(b.buffer.raw());
    const bool on_device = b.buffer.device().is_cuda();
    for (const Entry& e : b.entries) {
      Array reduced = Array::empty(e.local.shape(), e.local.dtype(), b.buffer.device());
      if (on_device) {
        cuda_runtime().copy_on_device(reduced.raw(), src, reduced.nbytes());
      } else {
        std::memcpy(reduced.raw(), src, reduced.nbytes());
      }
      src += reduced.nbytes();
      out[e.index] = global_view(reduced.to(e.local.device()), e.target);
    }
  }
  in_flight_.clear();
  done_.clear();
  g_last_stats = {buckets_issued_, during_backward};
  return out;
}

}  // namespace mt::dist

namespace mt::dist {

namespace {

// value_and_grad's view of the reducer: each gradient goes to its parameter's layout
// (a plain parameter: replicated) on the mesh of whichever of the two is distributed.
class BucketedGradientReduction : public autodiff::GradientReduction {
 public:
  void add(size_t index, const Array& grad, const Array& primal) override {
    auto [mesh, target] = destination(grad, primal);
    reducer_.add(index, grad, mesh, target);
  }
  std::vector<Array> finish(size_t count) override { return reducer_.finish(count); }
  Array to_layout_of(const Array& grad, const Array& primal) override {
    auto [mesh, target] = destination(grad, primal);
    return redistribute(grad, mesh, target);
  }

 private:
  static std::pair<Mesh, PartitionSpec> destination(const Array& grad, const Array& primal) {
    const Sharding* ps = sharding_of(primal);
    if (ps) return {ps->mesh, ps->spec.without_partial()};
    return {sharding_of(grad)->mesh, PartitionSpec{}};
  }
  GradReducer reducer_;
};

}  // namespace

void install_gradient_reduction() {
  autodiff::install_gradient_reduction([] { return std::make_unique<BucketedGradientReduction>(); });
}

}  // namespace mt::dist
