#include "meshtrain/optim/transform.h"

#include "meshtrain/ops/optimizer_ops.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/autodiff/plain_groups.h"
#include "meshtrain/core/device.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/sharding.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/reduce.h"

namespace mt::optim {

namespace {

// Counters of the optimizer state (the updates applied, multi_steps' micro-step), kept as 0-d
// i64 arrays on the host whatever the device: a step reads them (for the learning rate,
// Adam's bias corrections, whether to apply), and a host array's value waits for no device,
// so it is read in place, without counting a host read (core/host_reads.h). A counter
// restored elsewhere (another device, a layout) is read the counted way.
int64_t read_host_counter(const Params& state, const std::string& name) {
  const Array& c = state.at(name);
  if (c.device().is_cpu() && !c.distributed() && c.dtype() == DType::i64 && c.numel() == 1) return *c.data<int64_t>();
  return int64_t(c.item());
}
void write_host_counter(Params& state, const std::string& name, int64_t value) {
  state.set(name, Array::scalar(double(value), DType::i64, Device::cpu()));
}
int64_t read_count(const Params& state) { return read_host_counter(state, "count"); }
void write_count(Params& state, int64_t count) { write_host_counter(state, "count", count); }

Params zero_slots(const Params& params, const std::string& prefix) {
  Params out;
  for (const auto& [path, p] : params) out.set(prefix + path, zeros_like(p));
  return out;
}

void check_same_paths(const Params& updates, const Params& params, const char* op) {
  for (const auto& [path, u] : updates)
    MT_CHECK(params.contains(path), "[", op, "] update for unknown parameter '", path, "'");
}

}  // namespace

DecayMask default_decay_mask() {
  return [](const std::string&, const Array& p) { return p.ndim() >= 2; };
}

DecayMask decay_mask_regex(const std::string& pattern) {
  std::regex re;
  try {
    re = std::regex(pattern);
  } catch (const std::regex_error& e) {
    throw Error("[adamw] invalid weight-decay mask regex '" + pattern + "': " + e.what());
  }
  return [re](const std::string& path, const Array&) { return std::regex_match(path, re); };
}

Transform sgd(Schedule lr, double momentum, bool nesterov, double weight_decay) {
  MT_CHECK(momentum >= 0.0, "[sgd] momentum must be >= 0, got ", momentum);
  MT_CHECK(!nesterov || momentum > 0.0, "[sgd] nesterov needs momentum > 0");
  Transform t;
  t.init = [momentum](const Params& params) {
    Params s = momentum > 0 ? zero_slots(params, "momentum.") : Params{};
    write_count(s, 0);
    return s;
  };
  t.update = [=](const Params& grads, Params& state, const Params& params) {
    autodiff::NoGradGuard no_grad;
    check_same_paths(grads, params, "sgd");
    const int64_t count = read_count(state);
    const double rate = lr(count);
    Params out;
    for (const auto& [path, g0] : grads) {
      Array g = weight_decay != 0.0 ? add(g0, mul(params[path], weight_decay)) : g0;
      if (momentum > 0.0) {
        const std::string slot = "momentum." + path;
        // torch initializes the buffer with the first gradient itself.
        Array buf = count == 0 ? g : add(mul(state[slot], momentum), g);
        state.set(slot, buf);
        g = nesterov ? add(g, mul(buf, momentum)) : buf;
      }
      out.set(path, mul(g, -rate));
    }
    write_count(state, count + 1);
    return out;
  };
  return t;
}

namespace {
// The fused optimizer kernels run elementwise on f32 arrays of one shape. Sharded arrays take
// them too when all are laid out alike (the same mesh and spec, no partial sums: FSDP's
// parameters, reduced gradients and moments): each rank steps its own blocks. Others go
// through the composed ops, whose sharding rules place them.
bool same_layout(const Array& a, const Array& b) {
  if (a.distributed() != b.distributed()) return false;
  if (!a.distributed()) return true;
  const dist::Sharding &x = *dist::sharding_of(a), &y = *dist::sharding_of(b);
  return x.mesh == y.mesh && x.spec == y.spec;
}

bool fusable(std::initializer_list<Array> arrays) {
  const Array& first = *arrays.begin();
  for (const Array& a : arrays)
    if (a.dtype() != DType::f32 || a.shape() != first.shape() || !same_layout(a, first) ||
        (a.distributed() && !dist::sharding_of(a)->spec.partial.empty()))
      return false;
  return true;
}

// A rank's block of a fusable array (the array itself when it is not distributed), and back.
Array local_block(const Array& a) { return a.distributed() ? dist::local_view(a) : a; }
Array like_layout(Array local, const Array& model) {
  return model.distributed() ? dist::global_view(local, *dist::sharding_of(model)) : local;
}

// The views of a flat 1-d array whose pieces have `shapes`, one after another (the
// multi-tensor kernels' results and state).
std::vector<Array> cut_flat(const Array& flat, const std::vector<Shape>& shapes) {
  std::vector<Array> views;
  int64_t offset = 0;
  for (const Shape& shape : shapes) {
    views.push_back(flat.view_elements(offset, shape));
    offset += shape.numel();
  }
  return views;
}

Transform adam_impl(Schedule lr, double b1, double b2, double eps, double weight_decay, DecayMask mask) {
  MT_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "[adam] betas must be in [0, 1), got ", b1, ", ", b2);
  MT_CHECK(eps >= 0, "[adam] eps must be >= 0, got ", eps);
  Transform t;
  t.init = [](const Params& params) {
    // Plain f32 parameters' moments start as views of one flat zero buffer, laid out as
    // update() visits them, so even the first step updates them in place (no second copy of
    // the optimizer state at the step's peak). The others get their own zeros.
    std::map<std::string, size_t> flat;  // path -> its piece of the flat buffer
    std::vector<Shape> shapes;
    int64_t total = 0;
    Device device;
    // Sharded parameters' pieces are their local blocks, each wrapped back in its layout.
    for (const auto& [path, p] : params)
      if (fusable({p}) && (flat.empty() || local_block(p).device() == device)) {
        const Array local = local_block(p);
        device = local.device();
        flat[path] = shapes.size();
        shapes.push_back(local.shape());
        total += local.numel();
      }
    std::vector<Array> ms, vs;
    if (!flat.empty()) {
      const Array buffer = Array::zeros({2, total}, DType::f32, device);
      ms = cut_flat(buffer.view_row(0), shapes);
      vs = cut_flat(buffer.view_row(1), shapes);
    }
    Params s;
    for (const auto& [path, p] : params) {
      auto it = flat.find(path);
      s.set("mu." + path, it != flat.end() ? like_layout(std::move(ms[it->second]), p) : zeros_like(p));
    }
    for (const auto& [path, p] : params) {
      auto it = flat.find(path);
      s.set("nu." + path, it != flat.end() ? like_layout(std::move(vs[it->second]), p) : zeros_like(p));
    }
    write_count(s, 0);
    return s;
  };
  // The fused kernels read the step's size, bias correction and decay from this buffer, which
  // host_step rewrites in place before each update's launches (adam_step_scalars): the
  // launches are then the same from step to step, as a captured CUDA graph needs.
  struct HostStep {
    Array scalars;
    // The values of the update host_step prepared last, for the composed path of an eager step.
    double rate = 0, step_size = 0, sqrt_bc2 = 1;
  };
  auto host = std::make_shared<HostStep>();
  t.host_step = [=](Params& state) {
    const int64_t count = read_count(state) + 1;
    host->rate = lr(count - 1);
    const double bc1 = 1 - std::pow(b1, double(count)), bc2 = 1 - std::pow(b2, double(count));
    host->step_size = host->rate / bc1;
    host->sqrt_bc2 = std::sqrt(bc2);
    // The device buffer exists from the first update on (it knows the parameters' device).
    if (host->scalars.defined())
      write_adam_step_scalars(host->scalars, {b1, b2, host->step_size, host->sqrt_bc2, eps, host->rate * weight_decay});
    write_count(state, count);
  };
  // The gradients come by value (moved in by the Trainer and chain) so that the fused updates
  // can be written over them once the moments have read them: the step's peak is parameters +
  // moments + gradients, with no update buffer beside them.
  t.update = [=, host_step = t.host_step](Params grads, Params& state, const Params& params) {
    autodiff::NoGradGuard no_grad;
    check_same_paths(grads, params, "adam");
    // Recorded for replay, the host half has run already (the Trainer calls host_step first).
    const bool captured = capturing_device_work();
    if (!captured) host_step(state);
    const double rate = host->rate, step_size = host->step_size, sqrt_bc2 = host->sqrt_bc2;
    Params out;
    // Plain f32 parameters take the multi-tensor step: two memory passes over all of them in a
    // few kernel launches (two per parameter before), the same roundings as the composed ops
    // below. The moments then live in one flat buffer the state's slots are views of, which
    // the next step overwrites in place.
    std::vector<std::string> fused;
    std::vector<Array> fused_g, fused_m, fused_v, fused_p;
    std::vector<bool> fused_decay;
    for (const auto& [path, g] : grads) {
      Array &m_slot = state.at("mu." + path), &v_slot = state.at("nu." + path);
      const Array &m0 = m_slot, &v0 = v_slot, &p = params[path];
      const bool decays = weight_decay != 0.0 && mask(path, p);
      if (fusable({g, m0, v0, p}) && (fused.empty() || local_block(g).device() == fused_g.front().device())) {
        fused.push_back(path);
        fused_g.push_back(local_block(g));
        // The slots are emptied: the local blocks hold the only handles on the moments.
        fused_m.push_back(local_block(m_slot));
        fused_v.push_back(local_block(v_slot));
        m_slot = Array(), v_slot = Array();
        fused_p.push_back(local_block(p));
        fused_decay.push_back(decays);
        continue;
      }
      // Their step size would be a launch argument, replayed unchanged.
      MT_CHECK(!captured, "[cuda graphs] adam cannot capture the update of '", path, "' (", g.str(),
               "): only f32 parameters laid out like their moments take the fused step, whose values are read "
               "from device memory");
      Array m = add(mul(m0, b1), mul(g, 1 - b1));
      Array v = add(mul(v0, b2), mul(square(g), 1 - b2));
      state.set("mu." + path, m);
      state.set("nu." + path, v);
      // torch's order of operations: m / (sqrt(v) / sqrt(bc2) + eps) · lr / bc1.
      Array u = mul(div(m, add(div(sqrt(v), sqrt_bc2), eps)), -step_size);
      if (decays) u = sub(u, mul(p, rate * weight_decay));
      out.set(path, u);
    }
    if (!fused.empty()) {
      const AdamStep s{b1, b2, step_size, sqrt_bc2, eps, rate * weight_decay};
      const Device device = fused_g.front().device();
      if (!host->scalars.defined() || host->scalars.device() != device) {
        MT_CHECK(!captured, "[cuda graphs] adam's first update on ", device.str(),
                 " runs eagerly: it makes the buffer of its step values");
        host->scalars = adam_step_scalars(s, device);
      }
      std::vector<Shape> shapes;
      for (const Array& g : fused_g) shapes.push_back(g.shape());
      std::vector<Array> ms, vs;
      {
        const Array moments = adam_moments_multi(fused_g, std::move(fused_m), std::move(fused_v), s);
        ms = cut_flat(moments.view_row(0), shapes);
        vs = cut_flat(moments.view_row(1), shapes);
      }
      // The moments have read the gradients: with the global handles dropped, the local blocks
      // are their only handles (when the caller moved them in), and each update is written
      // over its gradient. The step then allocates nothing: a flat update buffer needed one
      // free range of the parameters' size, which fragmentation often lacked (GPT-2 Large under
      // --fsdp on two ranks grew each arena by 1.5 GB for it).
      grads = Params{};
      const std::vector<Array> updates =
          adam_direction_multi_into(std::move(fused_g), ms, vs, fused_p, s, fused_decay, host->scalars);
      for (size_t j = 0; j < fused.size(); ++j) {
        const Array& p = params[fused[j]];
        state.at("mu." + fused[j]) = like_layout(std::move(ms[j]), p);
        state.at("nu." + fused[j]) = like_layout(std::move(vs[j]), p);
        out.set(fused[j], like_layout(updates[j], p));
      }
    }
    return out;
  };
  return t;
}
}  // namespace

Transform adam(Schedule lr, double b1, double b2, double eps) {
  return adam_impl(std::move(lr), b1, b2, eps, 0.0, default_decay_mask());
}

Transform adamw(Schedule lr, double b1, double b2, double eps, double weight_decay, DecayMask mask) {
  return adam_impl(std::move(lr), b1, b2, eps, weight_decay, std::move(mask));
}

namespace {

// The arrays of `slots` moved out to `fn` (so a multi-tensor kernel may write over their
// buffers) and its results moved back in their places.
template <class Fn>
void update_slots(const std::vector<Array*>& slots, Fn&& fn) {
  std::vector<Array> xs;
  for (Array* slot : slots) xs.push_back(std::move(*slot));
  std::vector<Array> ys = fn(std::move(xs));
  for (size_t j = 0; j < slots.size(); ++j) *slots[j] = std::move(ys[j]);
}

}  // namespace

void scale_in_place(Params& tree, const Array& coef) {
  autodiff::NoGradGuard no_grad;
  // Plain arrays: one multi-tensor pass per device and dtype, each scaled in its own buffer
  // when the caller moved it in (GPT-2 Large's peak was one gradient-sized buffer higher with
  // scaled copies). Distributed ones: per tensor, as their layouts need.
  // The coefficient on the arrays' own device (parameters may live on another than the default).
  auto coef_on = [&](const Device& device) { return coef.device() == device ? coef : coef.to(device); };
  std::vector<TreeSlot<Array>> others;
  for (auto& group : plain_groups<Params, Array>(tree, others)) {
    const Array scale = coef_on(group.device);
    std::vector<Array*> slots;
    for (auto& slot : group.slots) slots.push_back(slot.array);
    update_slots(slots, [&](std::vector<Array> xs) { return scale_multi_into(std::move(xs), scale); });
  }
  for (auto& slot : others) {
    Array& u = *slot.array;
    if (!u.defined() || !is_floating(u.dtype())) continue;
    const Array c = coef_on(u.device());
    if (u.dtype() != DType::f32)
      u = cast(mul(cast(u, DType::f32), c), u.dtype());
    else if (c.device().is_cuda())
      u = mul(u, c);
    else  // a CPU value waits for nothing: read in place, not counted as a host read
      u = mul_in_place(std::move(u), scalar_like(u, double(*c.data<float>())));
  }
}

Array global_norm(const Params& tree) {
  // One multi-tensor pass per device and dtype over the plain arrays (a few launches on the GPU
  // where square, sum and add per tensor took hundreds); distributed arrays keep the composed
  // ops, whose sums span the mesh.
  Array total;  // a plain f32 scalar where the tree is (read with item(), which waits)
  auto accumulate = [&total](const Array& s) { total = total.defined() ? add(total, s) : s; };
  std::vector<TreeSlot<const Array>> others;
  for (const auto& group : plain_groups<const Params, const Array>(tree, others)) {
    std::vector<Array> xs;
    for (const auto& slot : group.slots) xs.push_back(*slot.array);
    accumulate(sum_of_squares_multi(xs));
  }
  for (const auto& slot : others)
    if (slot.array->defined()) accumulate(sum(square(cast(*slot.array, DType::f32))));
  if (!total.defined()) return Array::scalar(0.0);
  return dist::to_host(sqrt(total));
}

Transform clip_by_global_norm(double max_norm) {
  MT_CHECK(max_norm > 0, "[clip_by_global_norm] max_norm must be > 0, got ", max_norm);
  Transform t;
  t.init = [](const Params&) { return Params{}; };
  // On a GPU its launches carry only constants (the norm stays on the device).
  t.host_step = [](Params&) {};
  t.update = [max_norm](Params updates, Params&, const Params&) {
    autodiff::NoGradGuard no_grad;
    if (updates.empty()) return updates;
    const Array norm = global_norm(updates);
    // The coefficient, torch's clip_grad_norm_'s: max_norm / (norm + 1e-6) clamped at 1.
    Array coef;
    if (!norm.device().is_cuda()) {
      // On the CPU the norm is at hand: gradients within bounds pass untouched (no copy). A
      // CPU value waits for nothing: read in place, not counted as a host read.
      const double host_coef = max_norm / (double(*norm.data<float>()) + 1e-6);
      if (host_coef >= 1.0) return updates;
      coef = Array::scalar(host_coef, DType::f32);
    } else {
      // On a GPU, in f32 on the device, every gradient multiplied (by exactly 1 within
      // bounds): the host never reads the norm, so it goes on enqueueing the optimizer while
      // the backward pass still runs.
      const Device where = norm.device();
      coef = minimum(div(Array::scalar(max_norm, DType::f32, where), add(norm, 1e-6)),
                     Array::scalar(1.0, DType::f32, where));
    }
    scale_in_place(updates, coef);
    return updates;
  };
  return t;
}

Params take_subtree(Params& state, const std::string& prefix) {
  Params inner;
  const std::string p = prefix + ".";
  for (auto& [path, value] : state)
    if (path.compare(0, p.size(), p) == 0) inner.set(path.substr(p.size()), std::move(value));
  return inner;
}

void put_back_subtree(Params& state, const std::string& prefix, const Params& inner) {
  for (const auto& [path, v] : inner) state.set(prefix + "." + path, v);
}

bool is_frozen(const Transform& t, const std::string& path) { return t.frozen && t.frozen(path); }

std::pair<Params, Params> split_frozen(const Transform& t, const Params& params) {
  std::pair<Params, Params> out;
  for (const auto& [path, p] : params) (is_frozen(t, path) ? out.second : out.first).set(path, p);
  return out;
}

namespace {
// A parameter is frozen for a composite when any part freezes it.
std::function<bool(const std::string&)> any_frozen(const std::vector<Transform>& parts) {
  bool some = false;
  for (const Transform& t : parts) some = some || bool(t.frozen);
  if (!some) return {};
  return [parts](const std::string& path) {
    for (const Transform& t : parts)
      if (is_frozen(t, path)) return true;
    return false;
  };
}
}  // namespace

bool capturable(const Transform& t) { return bool(t.host_step); }

Transform identity() {
  Transform t;
  t.init = [](const Params&) { return Params{}; };
  t.host_step = [](Params&) {};
  t.update = [](Params updates, Params&, const Params&) { return updates; };
  return t;
}

Transform chain(std::vector<Transform> transforms) {
  Transform t;
  t.frozen = any_frozen(transforms);
  t.init = [transforms, frozen = t.frozen](const Params& params) {
    // No transform of the chain keeps state for a parameter any of them freezes.
    Transform filter;
    filter.frozen = frozen;
    const Params trainable = split_frozen(filter, params).first;
    Params s;
    for (size_t i = 0; i < transforms.size(); ++i)
      for (const auto& [path, v] : transforms[i].init(trainable)) s.set(std::to_string(i) + "." + path, v);
    return s;
  };
  bool all_capturable = true;
  for (const Transform& part : transforms) all_capturable = all_capturable && capturable(part);
  if (all_capturable)
    t.host_step = [transforms](Params& state) {
      for (size_t i = 0; i < transforms.size(); ++i) {
        const std::string prefix = std::to_string(i);
        Params inner = take_subtree(state, prefix);
        transforms[i].host_step(inner);
        put_back_subtree(state, prefix, inner);
      }
    };
  t.update = [transforms](Params updates, Params& state, const Params& params) {
    Params u = std::move(updates);
    for (size_t i = 0; i < transforms.size(); ++i) {
      const std::string prefix = std::to_string(i);
      Params inner = take_subtree(state, prefix);
      u = transforms[i].update(std::move(u), inner, params);
      put_back_subtree(state, prefix, inner);
    }
    return u;
  };
  return t;
}

Transform multi_steps(Transform inner, int every_k) {
  MT_CHECK(every_k >= 1, "[multi_steps] every_k must be >= 1, got ", every_k);
  Transform t;
  t.frozen = inner.frozen;
  t.init = [inner](const Params& params) {
    Params s = zero_slots(split_frozen(inner, params).first, "acc.");
    for (const auto& [path, v] : inner.init(params)) s.set("inner." + path, v);
    write_host_counter(s, "mini_step", 0);
    return s;
  };
  t.update = [inner, every_k](const Params& updates, Params& state, const Params& params) {
    autodiff::NoGradGuard no_grad;
    const int64_t mini = read_host_counter(state, "mini_step") + 1;
    Params acc;
    for (const auto& [path, u] : updates) acc.set(path, add(state["acc." + path], div(u, double(every_k))));
    Params out;
    if (mini < every_k) {
      for (const auto& [path, a] : acc) {
        state.set("acc." + path, a);
        out.set(path, zeros_like(a));
      }
      write_host_counter(state, "mini_step", mini);
      return out;
    }
    Params inner_state = take_subtree(state, "inner");
    out = inner.update(acc, inner_state, params);
    put_back_subtree(state, "inner", inner_state);
    for (const auto& [path, a] : acc) state.set("acc." + path, zeros_like(a));
    write_host_counter(state, "mini_step", 0);
    return out;
  };
  return t;
}

Params apply_updates(Params params, const Params& updates) {
  autodiff::NoGradGuard no_grad;
  for (const auto& [path, u] : updates)
    if (params.contains(path))
      MT_CHECK(u.shape() == params[path].shape(), "[apply_updates] update for '", path, "' has shape ",
               u.shape().str(), ", parameter ", params[path].shape().str());
  // Plain parameters with plain updates of their dtype: one multi-tensor pass per device and
  // dtype (a launch per 96 tensors on the GPU instead of one per parameter), in place where the
  // caller moved the parameters in. The others, per tensor.
  std::vector<TreeSlot<Array>> others;
  for (auto& group : plain_groups<Params, Array>(params, others)) {
    std::vector<Array*> slots;
    std::vector<Array> us;
    for (const auto& slot : group.slots) {
      if (!updates.contains(*slot.path)) continue;
      const Array& u = updates[*slot.path];
      if (u.sharded() || u.dtype() != slot.array->dtype() || u.device() != slot.array->device()) {
        others.push_back(slot);
        continue;
      }
      slots.push_back(slot.array);
      us.push_back(u);
    }
    if (!slots.empty())
      update_slots(slots, [&](std::vector<Array> ps) { return add_multi_into(std::move(ps), us); });
  }
  for (auto& slot : others)
    if (updates.contains(*slot.path))
      *slot.array = add_in_place(std::move(*slot.array), cast(updates[*slot.path], slot.array->dtype()));
  return params;
}

}  // namespace mt::optim
