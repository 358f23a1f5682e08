#include "meshtrain/distributed/spmd.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/trace.h"
#include "meshtrain/distributed/collective_ops.h"
#include "meshtrain/distributed/grad_reducer.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"

namespace mt::dist {

using Grads = std::vector<Array>;

bool is_sharded(const Array& x) { return x.defined() && x.distributed(); }

// dist::Sharding is the only Layout implementation.
const Sharding* sharding_of(const Array& x) {
  return x.defined() ? static_cast<const Sharding*>(x.impl()->layout.get()) : nullptr;
}

namespace {

PartitionSpec spec_of(const Array& x) {
  const Sharding* s = sharding_of(x);
  return s ? s->spec : PartitionSpec{};
}

// A global handle on `local`'s storage (no history).
Array wrap_global(const Array& local, const Sharding& sharding) {
  Shape global = local.shape();
  std::vector<int64_t> dims = global.dims();
  for (int d = 0; d < sharding.spec.ndim() && d < global.ndim(); ++d) dims[size_t(d)] *= sharding.num_blocks(d);
  auto impl = std::make_shared<ArrayImpl>(*local.impl());
  impl->shape = Shape(dims);
  impl->node = nullptr;
  impl->layout = std::make_shared<Sharding>(sharding);
  return Array(std::move(impl));
}

// This rank's block of x as a plain array sharing storage (no history).
Array unwrap_local(const Array& x) {
  auto impl = std::make_shared<ArrayImpl>(*x.impl());
  impl->shape = sharding_of(x)->local_shape(x.shape());
  impl->node = nullptr;
  impl->layout = nullptr;
  return Array(std::move(impl));
}

// Block `index` of `count` equal blocks of x along dim d.
Array block_of(const Array& x, int d, int64_t count, int64_t index) {
  if (count == 1) return x;
  const int64_t n = x.dim(d) / count;
  return slice(x, d, index * n, (index + 1) * n);
}

// The local block of layout `to` from the local block of layout `from` (no history).
Array relayout(Array local, const Shape& global, const Mesh& mesh, const PartitionSpec& from, const PartitionSpec& to) {
  autodiff::NoGradGuard no_grad;
  PartitionSpec cur = from.padded(global.ndim());
  const PartitionSpec target = to.padded(global.ndim());
  // 1. Partial sums: a reduce-scatter when the target splits a so-far unsplit dim over
  //    exactly that axis, else an all-reduce.
  for (const std::string& axis : cur.partial) {
    if (target.is_partial(axis)) continue;
    int td = target.dim_of(axis);
    if (td >= 0 && cur.dims[size_t(td)].empty() && target.dims[size_t(td)] == std::vector<std::string>{axis}) {
      local = reduce_scatter_dim(local, td, mesh.axis_comm(axis));
      cur.dims[size_t(td)] = {axis};
    } else {
      local = all_reduce_sum(local, mesh.axis_comm(axis));
    }
  }
  for (const std::string& axis : target.partial) {
    // Replicated -> partial: rank 0 of the axis keeps the value, the others hold zeros. An
    // axis already partial keeps every rank's term (zeroing them lost all but one).
    if (!cur.is_partial(axis) && mesh.axis_index(axis) != 0) local = zeros_like(local);
  }
  cur.partial = {};
  // 2. Dims whose split changes: gather every axis of the old split (minor first), then
  //    cut by the new one (major first).
  for (int d = 0; d < global.ndim(); ++d) {
    if (cur.dims[size_t(d)] == target.dims[size_t(d)]) continue;
    for (auto it = cur.dims[size_t(d)].rbegin(); it != cur.dims[size_t(d)].rend(); ++it)
      local = all_gather_dim(local, d, mesh.axis_comm(*it));
    cur.dims[size_t(d)].clear();
  }
  for (int d = 0; d < global.ndim(); ++d) {
    if (cur.dims[size_t(d)] == target.dims[size_t(d)]) continue;
    for (const std::string& axis : target.dims[size_t(d)])
      local = block_of(local, d, mesh.axis_size(axis), mesh.axis_index(axis));
    cur.dims[size_t(d)] = target.dims[size_t(d)];
  }
  return local;
}

// x's local block for a computation whose output uses `out_axes`: the cotangent flowing back
// from the local computation is partial over the axes the output uses but x does not (ranks
// along them computed different parts of the output with the same x).
Array enter_local(const Array& x, const Mesh& mesh, const PartitionSpec& spec, const std::vector<std::string>& out_axes) {
  std::vector<std::string> used = spec.used_axes(), extra;
  for (const std::string& a : out_axes)
    if (std::find(used.begin(), used.end(), a) == used.end() && mesh.axis_size(a) > 1) extra.push_back(a);
  Array out = is_sharded(x) ? unwrap_local(x) : x.detach();
  Sharding grad_sharding{mesh, spec.without_partial().with_partial(extra)};
  autodiff::record(out, "local_view", {x}, [grad_sharding](const Array& g) {
    return Grads{global_view(g, grad_sharding)};
  });
  return out;
}

}  // namespace

Array local_view(const Array& x) {
  if (!is_sharded(x)) return x;
  Array out = unwrap_local(x);
  Sharding grad_sharding{sharding_of(x)->mesh, sharding_of(x)->spec.without_partial()};
  autodiff::record(out, "local_view", {x}, [grad_sharding](const Array& g) {
    return Grads{global_view(g, grad_sharding)};
  });
  return out;
}

Array global_view(const Array& local, const Sharding& sharding) {
  if (sharding.is_trivial()) return local;
  MT_CHECK(!local.sharded(), "[global_view] ", local.str(), " is already global");
  Array out = wrap_global(local, sharding);
  const Mesh mesh = sharding.mesh;
  const PartitionSpec grad_spec = sharding.spec.without_partial();
  autodiff::record(out, "global_view", {local}, [mesh, grad_spec](const Array& g) {
    return Grads{local_view(redistribute(g, mesh, grad_spec))};
  });
  return out;
}

namespace {

// FSDP's weight gradient under --grad-reduce-dtype bf16: the cotangent of a parameter gathered
// over the data axis (whole, or still split over model on a data x model mesh) comes back
// partial over the data axis (each rank's batch) and goes to the parameter's layout, one dim
// split over that axis and the others as the cotangent's. That reduce-scatter
// may then move bf16 (reduce_scatter_dim_bf16): the dim, or -1 where it stays as it is (f32
// chosen, another dtype or layout, one rank, a nested trace). The test is on layouts, not on
// where the cotangent came from: an activation gathered whole and then met with the local
// batch (in-batch negatives) would take it too, its cotangent rounded as a gradient's is.
int narrow_reduce_scatter_dim(const Array& g, const Sharding& gs, const PartitionSpec& back) {
  // A backward recorded for a higher-order gradient keeps the recorded (f32) reduce-scatter:
  // this one records nothing.
  if (autodiff::grad_enabled() || grad_reduce_dtype() != DType::bf16 || g.dtype() != DType::f32 ||
      gs.spec.partial != std::vector<std::string>{"data"} || !gs.mesh.has_axis("data") ||
      gs.mesh.axis_comm("data").size() < 2)
    return -1;
  const int nd = int(g.ndim());
  const PartitionSpec have = gs.spec.without_partial().padded(nd), want = back.padded(nd);
  const int d = want.dim_of("data");
  if (d < 0 || want.dims[size_t(d)] != std::vector<std::string>{"data"} || !have.dims[size_t(d)].empty()) return -1;
  PartitionSpec scattered = have;
  scattered.dims[size_t(d)] = {"data"};
  return scattered == want ? d : -1;
}

}  // namespace

Array redistribute(const Array& x, const Mesh& mesh, const PartitionSpec& to) {
  const PartitionSpec from = spec_of(x);
  const Sharding* s = sharding_of(x);
  if (s) MT_CHECK(s->mesh == mesh, "[redistribute] ", x.str(), " lives on mesh ", s->mesh.str(), ", not ", mesh.str());
  Sharding target{mesh, to};
  target.validate(x.shape(), "redistribute target");
  if (from == to) return x;
  Array local = is_sharded(x) ? unwrap_local(x) : x.detach();
  Array moved = relayout(local, x.shape(), mesh, from, to);
  Array out = target.is_trivial() ? moved : wrap_global(moved, target);
  const PartitionSpec back = from.without_partial();
  autodiff::record(out, "redistribute", {x}, [mesh, back](const Array& g) {
    // A cotangent from a computation on another mesh comes back whole, as before.
    const Sharding* gs = sharding_of(g);
    if (gs && gs->mesh == mesh) {
      const int d = narrow_reduce_scatter_dim(g, *gs, back);
      if (d >= 0)
        return Grads{wrap_global(reduce_scatter_dim_bf16(unwrap_local(g), d, mesh.axis_comm("data")),
                                 Sharding{mesh, back})};
    }
    return Grads{redistribute(gs && gs->mesh != mesh ? to_host(g) : g, mesh, back)};
  });
  // Gathered to a plain array (FSDP's parameter gather), the cotangent comes back partial
  // from the ranks' different batches; redistributing it as it is reduce-scatters it. Gathered
  // first, it was all-reduced whole and then sliced: twice the traffic, and a second full
  // gradient per rank (GPT-2 Large's 257 MB embedding, twice a step).
  if (target.is_trivial()) autodiff::accept_distributed_cotangent(out);
  return out;
}

Array redistribute(const Array& x, const PartitionSpec& to) {
  const Sharding* s = sharding_of(x);
  MT_CHECK(s, "[redistribute] ", x.str(), " has no mesh; pass one");
  return redistribute(x, s->mesh, to);
}

Array with_sharding_constraint(const Array& x, const Mesh& mesh, const PartitionSpec& spec, const std::string& what) {
  Sharding{mesh, spec}.validate(x.shape(), what);
  return redistribute(x, mesh, spec);
}

Array shard(const Array& host, const Sharding& sharding, const std::string& what) {
  MT_CHECK(host.defined(), "[shard] ", what, ": undefined array");
  MT_CHECK(!host.sharded(), "[shard] ", what, ": ", host.str(), " is already sharded");
  sharding.validate(host.shape(), what);
  MT_CHECK(sharding.spec.partial.empty(), "[shard] ", what, ": a host array cannot be partial");
  if (sharding.is_trivial()) return host;
  Array local = host;
  {
    autodiff::NoGradGuard no_grad;
    for (int d = 0; d < sharding.spec.ndim(); ++d)
      local = block_of(local, d, sharding.num_blocks(d), sharding.block_index(d));
  }
  if (local.shares_storage(host)) local = local.clone();
  return global_view(local, sharding);
}

Array shard(const Array& host, const Mesh& mesh, const PartitionSpec& spec, const std::string& what) {
  return shard(host, Sharding{mesh, spec}, what);
}

Array to_host(const Array& x) {
  if (!is_sharded(x)) return x;
  return local_view(redistribute(x, PartitionSpec{}));
}

namespace {

// Runs primitives on global arrays: the primitive's sharding rule says which layout to
// compute in, inputs are redistributed to it, and every rank applies the localized primitive
// to its blocks. The blocks enter and leave through recorded local/global views, so
// gradients flow back through the same communication.
class SpmdExecutor : public prim::DistributedExecutor {
 public:
  Array apply(const prim::PrimitivePtr& p, const std::vector<Array>& inputs,
              const prim::OutputInfo& global) const override {
    return run(p, inputs, global, nullptr);
  }
  Array apply_moving_first(const prim::PrimitivePtr& p, std::vector<Array> inputs,
                           const prim::OutputInfo& global) const override {
    return run(p, inputs, global, &inputs[0]);
  }

  Array gather(const Array& x) const override { return to_host(x); }
  Array redistribute(const Array& x, const layout::PartitionSpec& spec) const override {
    return dist::redistribute(x, spec);
  }
  layout::PartitionSpec spec_of(const Array& x) const override { return dist::spec_of(x); }
  layout::MeshShape mesh_shape_of(const Array& x) const override { return sharding_of(x)->mesh.shape(); }

 private:
  // `moved_first` is the caller's own handle to inputs[0] when it was moved in: once its block
  // is taken, the global handles to it are dropped, so that a block nobody else holds reaches
  // the kernel as its storage's sole owner and takes the output (a sharded gradient summed in
  // place).
  Array run(const prim::PrimitivePtr& p, const std::vector<Array>& inputs, const prim::OutputInfo& global,
            Array* moved_first) const {
    // `mesh` points into an input's layout: kept alive when inputs[0] is dropped below.
    const std::shared_ptr<const Layout> first_layout = moved_first && moved_first->defined() ? moved_first->impl()->layout : nullptr;
    const Mesh* mesh = nullptr;
    for (const Array& a : inputs) {
      if (!is_sharded(a)) continue;
      const Mesh& m = sharding_of(a)->mesh;
      if (!mesh) mesh = &m;
      MT_CHECK(*mesh == m, "[", p->name(), "] inputs live on different meshes: ", mesh->str(), " and ", m.str());
    }
    const layout::MeshShape mesh_shape = mesh->shape();
    std::vector<layout::ArgInfo> infos;
    for (const Array& a : inputs)
      infos.push_back(a.defined() ? layout::ArgInfo{a.shape(), spec_of(a), a.dtype(), true}
                                  : layout::ArgInfo{{}, {}, DType::f32, false});
    layout::RuleResult r = p->sharding(infos, mesh_shape);
    MT_CHECK(r.inputs.size() == inputs.size(), "[", p->name(), "] sharding rule returned ", r.inputs.size(),
             " layouts for ", inputs.size(), " inputs");
    prim::LocalContext ctx;
    ctx.mesh = mesh_shape;
    std::vector<Array> locals;
    for (size_t i = 0; i < inputs.size(); ++i) {
      ctx.input_specs.push_back(r.inputs[i]);
      if (!inputs[i].defined()) {
        locals.emplace_back();
        ctx.input_global.emplace_back();
        ctx.input_offsets.emplace_back();
        continue;
      }
      Array x = inputs[i];
      if (spec_of(x) != r.inputs[i]) x = dist::redistribute(x, *mesh, r.inputs[i]);
      ctx.input_global.push_back(x.shape());
      ctx.input_offsets.push_back(Sharding{*mesh, r.inputs[i]}.local_offsets(x.shape()));
      locals.push_back(enter_local(x, *mesh, r.inputs[i], r.output.used_axes()));
      if (moved_first && i == 0) x = *moved_first = Array();
    }
    Sharding out{*mesh, r.output};
    ctx.output_spec = r.output;
    ctx.output_global = global.shape;
    ctx.output_local = out.local_shape(global.shape);
    ctx.output_offsets = out.local_offsets(global.shape);
    std::optional<trace::Span> span;  // the op on global arrays, with its layouts, around the kernel
    if (trace::enabled()) {
      std::string in_specs;
      for (const layout::PartitionSpec& spec : r.inputs) in_specs += (in_specs.empty() ? "" : ", ") + spec.str();
      span.emplace("spmd", p->name(),
                   trace::arg("inputs", in_specs) + ", " + trace::arg("output", r.output.str()) + ", " +
                       trace::arg("mesh", mesh->str()));
    }
    Array out_local = prim::apply(p->localize(ctx, p), locals);
    span.reset();
    return global_view(out_local, out);
  }
};

}  // namespace

void install_spmd() {
  static const SpmdExecutor executor;
  static const bool installed = [] {
    prim::install_distributed_executor(&executor);
    install_gradient_reduction();
    return true;
  }();
  (void)installed;
}

}  // namespace mt::dist
