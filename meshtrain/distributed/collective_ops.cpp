#include "meshtrain/distributed/collective_ops.h"

#include <numeric>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::dist {

namespace {
// The communicator that moves `x` where it lives: for a GPU array, the ranks' device
// communicator (NCCL) when they have one; nullptr means: stage x through the host for `comm`.
// Asked on every rank whatever its device: the first ask is a collective.
Communicator* device_comm_for(const Array& x, Communicator& comm) {
  Communicator* device_comm = comm.device_communicator(x.device());
  return x.device().is_cuda() ? device_comm : nullptr;
}
// The product of the dims before d: 1 (all of them 1) when splitting d cuts x into
// consecutive blocks.
int64_t leading_numel(const Array& x, int d) {
  int64_t n = 1;
  for (int i = 0; i < d; ++i) n *= x.dim(i);
  return n;
}
}  // namespace

// (..., n_d, ...) blocks of the ranks of `comm`, concatenated along d in rank order.
Array all_gather_dim(const Array& x, int d, Communicator& comm) {
  MT_CHECK(!x.sharded(), "[all_gather] expects a local block, got the global ", x.str());
  d = x.shape().axis(d, "all_gather");
  const int p = comm.size();
  if (p == 1) return x;
  std::vector<int64_t> dims = x.shape().dims();
  dims.insert(dims.begin(), p);
  Array buf;
  if (Communicator* device_comm = device_comm_for(x, comm)) {
    buf = Array::empty(Shape(dims), x.dtype(), x.device());
    device_comm->all_gather(x.raw(), buf.raw(), x.numel(), x.dtype());
  } else {  // MPI moves host memory: a device block goes through the host
    const Array xh = x.to(Device::cpu());
    buf = Array::empty(Shape(dims), x.dtype(), Device::cpu());
    comm.all_gather(xh.raw(), buf.raw(), x.numel(), x.dtype());
    buf = buf.to(x.device());
  }
  std::vector<int64_t> merged = x.shape().dims();
  merged[size_t(d)] *= p;
  if (leading_numel(x, d) == 1) return reshape(buf, merged);  // rank blocks already in place
  std::vector<int> perm(size_t(buf.ndim()));
  std::iota(perm.begin(), perm.end(), 0);
  perm.erase(perm.begin());
  perm.insert(perm.begin() + d, 0);  // (..., P, n_d, ...)
  return reshape(transpose(buf, perm), merged);
}

namespace {

// x's blocks along d, one per rank, as (P, ...) with block r the r-th (a view where they
// already lie one after another), and the shape of one block.
std::pair<Array, std::vector<int64_t>> rank_blocks(const Array& x, int d, int p) {
  std::vector<int64_t> split = x.shape().dims();
  split[size_t(d)] /= p;
  split.insert(split.begin() + d, p);  // (..., P, n_d / P, ...)
  std::vector<int> perm(split.size());
  std::iota(perm.begin(), perm.end(), 0);
  perm.erase(perm.begin() + d);
  perm.insert(perm.begin(), d);  // (P, ..., n_d / P, ...)
  // Split along the outermost dim that is not 1, the blocks already lie one after another:
  // no transposed copy of the whole (for FSDP's embedding gradient, 257 MB in GPT-2 Large).
  Array blocks = leading_numel(x, d) == 1 ? x : transpose(reshape(x, split), perm);
  std::vector<int64_t> out_dims = x.shape().dims();
  out_dims[size_t(d)] /= p;
  return {blocks, out_dims};
}

int checked_scatter_dim(const Array& x, int d, const Communicator& comm) {
  MT_CHECK(!x.sharded(), "[reduce_scatter] expects a local block, got the global ", x.str());
  d = x.shape().axis(d, "reduce_scatter");
  MT_CHECK(x.dim(d) % comm.size() == 0, "[reduce_scatter] dim ", d, " of ", x.str(), " is not divisible by ",
           comm.size(), " ranks of '", comm.name(), "'");
  return d;
}

}  // namespace

// Sums x over the ranks of `comm` and keeps this rank's block along d.
Array reduce_scatter_dim(const Array& x, int d, Communicator& comm) {
  d = checked_scatter_dim(x, d, comm);
  const int p = comm.size();
  if (p == 1) return x;
  const auto [blocks, out_dims] = rank_blocks(x, d, p);
  if (Communicator* device_comm = device_comm_for(x, comm)) {
    Array out = Array::empty(Shape(out_dims), x.dtype(), x.device());
    device_comm->reduce_scatter(blocks.raw(), out.raw(), out.numel(), x.dtype(), ReduceOp::sum);
    return out;
  }
  const Array blocks_host = blocks.to(Device::cpu());
  Array out = Array::empty(Shape(out_dims), x.dtype(), Device::cpu());
  comm.reduce_scatter(blocks_host.raw(), out.raw(), out.numel(), x.dtype(), ReduceOp::sum);
  return out.to(x.device());
}

Bf16ReduceScatter::Bf16ReduceScatter(const Array& blocks, Communicator& comm, Device where) : ranks_(comm.size()) {
  MT_CHECK(blocks.dtype() == DType::f32 && blocks.numel() % ranks_ == 0, "[reduce_scatter] bf16 on the wire takes ",
           ranks_, " equal blocks of f32, got ", blocks.str());
  autodiff::NoGradGuard no_grad;
  sent_ = cast(blocks, DType::bf16).to(where);  // contiguous, rank-major
  const int64_t count = blocks.numel() / ranks_;
  received_ = Array::empty({int64_t(ranks_), count}, DType::bf16, where);
  handle_ = comm.all_to_all_async(sent_.raw(), received_.raw(), count, DType::bf16);
}

Array Bf16ReduceScatter::finish() {
  handle_.wait();
  autodiff::NoGradGuard no_grad;
  // Row r: rank r's copy of this rank's block; summed in rank order.
  Array mine = sum(cast(received_, DType::f32), {0});
  sent_ = received_ = Array();
  return mine;
}

Array reduce_scatter_dim_bf16(const Array& x, int d, Communicator& comm) {
  d = checked_scatter_dim(x, d, comm);
  MT_CHECK(x.dtype() == DType::f32, "[reduce_scatter] bf16 on the wire takes f32 blocks, got ", x.str());
  const int p = comm.size();
  if (p == 1) return x;
  autodiff::NoGradGuard no_grad;
  const auto [blocks, out_dims] = rank_blocks(x, d, p);
  Communicator* device_comm = device_comm_for(x, comm);
  Bf16ReduceScatter exchange(blocks, device_comm ? *device_comm : comm, device_comm ? x.device() : Device::cpu());
  return reshape(exchange.finish(), out_dims).to(x.device());
}

Array all_reduce_sum(const Array& x, Communicator& comm) {
  if (comm.size() == 1) return x;
  if (Communicator* device_comm = device_comm_for(x, comm)) {
    Array out = x.clone();
    device_comm->all_reduce(out.raw(), out.numel(), out.dtype(), ReduceOp::sum);
    return out;
  }
  Array out = x.device().is_cpu() ? x.clone() : x.to(Device::cpu());
  comm.all_reduce(out.raw(), out.numel(), out.dtype(), ReduceOp::sum);
  return out.to(x.device());
}


using Grads = std::vector<Array>;

Array all_gather(const Array& local, const Mesh& mesh, const std::string& axis, int dim) {
  dim = local.shape().axis(dim, "all_gather");
  Array out;
  {
    autodiff::NoGradGuard no_grad;
    out = all_gather_dim(local.detach(), dim, mesh.axis_comm(axis));
  }
  autodiff::record(out, "all_gather", {local}, [mesh, axis, dim](const Array& g) {
    return Grads{reduce_scatter(g, mesh, axis, dim)};
  });
  return out;
}

Array reduce_scatter(const Array& local, const Mesh& mesh, const std::string& axis, int dim) {
  dim = local.shape().axis(dim, "reduce_scatter");
  Array out;
  {
    autodiff::NoGradGuard no_grad;
    out = reduce_scatter_dim(local.detach(), dim, mesh.axis_comm(axis));
  }
  autodiff::record(out, "reduce_scatter", {local}, [mesh, axis, dim](const Array& g) {
    return Grads{all_gather(g, mesh, axis, dim)};
  });
  return out;
}

Array all_reduce(const Array& local, const Mesh& mesh, const std::string& axis) {
  Array out;
  {
    autodiff::NoGradGuard no_grad;
    out = all_reduce_sum(local.detach(), mesh.axis_comm(axis));
  }
  autodiff::record(out, "all_reduce", {local}, [](const Array& g) { return Grads{g}; });
  return out;
}

}  // namespace mt::dist
