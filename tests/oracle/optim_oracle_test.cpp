// Optimizers step by step against torch.optim: the same parameters and gradient sequence
// go through both, and the parameters after every step must agree.
#include <gtest/gtest.h>

#include <map>

#include <cmath>
#include <set>

#include "meshtrain/ops/optimizer_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

using namespace mt::optim;

constexpr int kSteps = 5;

struct Case {
  std::string name;
  std::function<Transform()> make;
  std::string torch_setup;  // builds `opt` (and optionally `sched`) over params w, b
  std::string torch_before_step = "";
};

// Runs the transform for kSteps on fixed gradients and compares the parameters after each
// step with torch.
void check_optimizer(const Case& c) {
  Params params{{"w", random_normal({5, 4}, 1)}, {"b", random_normal({4}, 2)}};
  std::vector<Params> grads;
  for (int s = 0; s < kSteps; ++s)
    grads.push_back(Params{{"w", random_normal({5, 4}, 10 + uint64_t(s))}, {"b", random_normal({4}, 20 + uint64_t(s))}});
  Transform t = c.make();
  Params state = t.init(params);
  std::vector<Params> history;
  for (int s = 0; s < kSteps; ++s) {
    Params updates = t.update(grads[size_t(s)], state, params);
    params = apply_updates(params, updates);
    history.push_back(params);
  }
  std::vector<OracleTensor> ins{to_oracle(random_normal({5, 4}, 1)), to_oracle(random_normal({4}, 2))};
  for (const Params& g : grads) {
    ins.push_back(to_oracle(g["w"]));
    ins.push_back(to_oracle(g["b"]));
  }
  std::string code = R"(
w = x0.detach().clone().requires_grad_(True)
b = x1.detach().clone().requires_grad_(True)
sched = None
)" + c.torch_setup + R"(
outs = []
for s in range()" + std::to_string(kSteps) + R"():
    w.grad = xs[2 + 2 * s].clone()
    b.grad = xs[3 + 2 * s].clone()
)" + c.torch_before_step + R"(
    opt.step()
    if sched is not None:
        sched.step()
    outs += [w.detach().clone(), b.detach().clone()]
out = tuple(outs)
)";
  OracleResult ref = TorchOracle::instance().run(code, ins);
  for (int s = 0; s < kSteps; ++s) {
    expect_close(history[size_t(s)]["w"], ref.outputs[size_t(2 * s)], {1e-6, 1e-5}, c.name + " step " + std::to_string(s + 1) + " w");
    expect_close(history[size_t(s)]["b"], ref.outputs[size_t(2 * s + 1)], {1e-6, 1e-5}, c.name + " step " + std::to_string(s + 1) + " b");
  }
}

TEST(OptimOracle, MatchesTorchStepByStep) {
  const std::vector<Case> cases = {
      {"sgd", [] { return sgd(constant_schedule(0.1)); }, "opt = torch.optim.SGD([w, b], lr=0.1)"},
      {"sgd momentum", [] { return sgd(constant_schedule(0.1), 0.9); }, "opt = torch.optim.SGD([w, b], lr=0.1, momentum=0.9)"},
      {"sgd nesterov wd", [] { return sgd(constant_schedule(0.05), 0.9, true, 0.01); },
       "opt = torch.optim.SGD([w, b], lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)"},
      {"adam", [] { return adam(constant_schedule(0.01)); }, "opt = torch.optim.Adam([w, b], lr=0.01)"},
      {"identity + adam", [] { return chain({identity(), adam(constant_schedule(0.01))}); },
       "opt = torch.optim.Adam([w, b], lr=0.01)"},
      {"adamw masked", [] { return adamw(constant_schedule(0.01), 0.9, 0.98, 1e-6, 0.1); },
       "opt = torch.optim.AdamW([{'params': [w], 'weight_decay': 0.1}, {'params': [b], 'weight_decay': 0.0}], lr=0.01, betas=(0.9, 0.98), eps=1e-6)"},
      {"adamw regex mask", [] { return adamw(constant_schedule(0.01), 0.9, 0.999, 1e-8, 0.1, decay_mask_regex("b")); },
       "opt = torch.optim.AdamW([{'params': [w], 'weight_decay': 0.0}, {'params': [b], 'weight_decay': 0.1}], lr=0.01)"},
      {"clip + adamw",
       [] { return chain({clip_by_global_norm(1.0), adamw(constant_schedule(0.01), 0.9, 0.999, 1e-8, 0.0)}); },
       "opt = torch.optim.AdamW([w, b], lr=0.01, weight_decay=0.0)", "    torch.nn.utils.clip_grad_norm_([w, b], 1.0)"},
      {"warmup linear schedule", [] { return adam(warmup_linear_decay_schedule(0.01, 2, 10)); },
       "opt = torch.optim.Adam([w, b], lr=0.01)\n"
       "sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: s / 2 if s < 2 else max(0.0, (10 - s) / 8))"},
      {"cosine schedule", [] { return sgd(cosine_decay_schedule(0.1, 4), 0.9); },
       "opt = torch.optim.SGD([w, b], lr=0.1, momentum=0.9)\n"
       "sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, 4) / 4)))"},
  };
  for (const Case& c : cases) check_optimizer(c);
}

TEST(OptimOracle, MultiStepsAveragesAccumulatedGradients) {
  // Two calls of multi_steps(sgd, 2) equal one SGD step on the mean of the two gradients.
  Params params{{"w", random_normal({3, 2}, 1)}};
  Params g1{{"w", random_normal({3, 2}, 2)}}, g2{{"w", random_normal({3, 2}, 3)}};
  Transform t = multi_steps(sgd(constant_schedule(0.5), 0.9), 2);
  Params state = t.init(params);
  Params u1 = t.update(g1, state, params);
  expect_close(u1["w"], Array::zeros({3, 2}), {0, 0}, "multi_steps first call is a no-op");
  params = apply_updates(params, u1);
  params = apply_updates(params, t.update(g2, state, params));
  Array expected = sub(random_normal({3, 2}, 1), mul(div(add(g1["w"], g2["w"]), 2.0), 0.5));
  expect_close(params["w"], expected, {1e-6, 1e-6}, "multi_steps k=2");
}

TEST(Optim, SchedulesAndErrors) {
  Schedule s = warmup_cosine_decay_schedule(0.0, 1.0, 10, 110, 0.1);
  EXPECT_DOUBLE_EQ(s(0), 0.0);
  EXPECT_DOUBLE_EQ(s(5), 0.5);
  EXPECT_DOUBLE_EQ(s(10), 1.0);
  EXPECT_NEAR(s(60), 0.55, 1e-12);
  EXPECT_NEAR(s(1000), 0.1, 1e-12);
  EXPECT_THROW(linear_schedule(1, 0, 0), Error);
  EXPECT_THROW(sgd(constant_schedule(0.1), -1.0), Error);
  expect_error([] { decay_mask_regex("(unclosed"); }, {"[adamw]", "(unclosed"});
  Transform t = sgd(constant_schedule(0.1));
  Params p{{"w", Array::zeros({2})}};
  Params state = t.init(p);
  expect_error([&] { t.update(Params{{"v", Array::zeros({2})}}, state, p); }, {"[sgd]", "'v'"});
}

// AdamW on plain f32 parameters runs the multi-tensor kernels (adam_moments_multi,
// adam_direction_multi: one call each per step for all parameters); written out with
// elementwise ops, as it runs on distributed arrays, it rounds the same: four steps agree bit
// for bit, weight decay on the matrices and not on the bias. The moments are updated in
// place from the first step: the state's slots keep viewing the buffer init made.
TEST(Optim, FusedAdamWEqualsTheComposedOps) {
  Params params{{"w", random_normal({37, 19}, 1)}, {"b", random_normal({19}, 2)}, {"k", random_normal({3, 2, 5}, 3)}};
  const double lr = 3e-3, b1 = 0.8, b2 = 0.99, eps = 1e-6, wd = 0.1;
  optim::Transform opt = optim::adamw(optim::constant_schedule(lr), b1, b2, eps, wd);
  Params state = opt.init(params), ref = params;
  Params m = opt.init(params), v = opt.init(params);  // the reference's own zeros: copies of `state` would share its buffer
  std::map<std::string, int> fused_calls;
  prim::OpObserver previous = prim::set_op_observer([&](const prim::OpEvent& e) { ++fused_calls[e.primitive.name()]; });
  // init lays the moments out flat already: every step, the first included, updates them in place.
  const void* moments_buffer = state["mu.b"].impl()->storage.get();
  EXPECT_TRUE(state["mu.w"].shares_storage(state["nu.k"]));
  for (int t = 1; t <= 4; ++t) {
    Params grads{{"w", random_normal({37, 19}, 10 + t)},
                 {"b", random_normal({19}, 20 + t)},
                 {"k", random_normal({3, 2, 5}, 30 + t)}};
    params = optim::apply_updates(params, opt.update(grads, state, params));
    EXPECT_EQ(fused_calls["adam_moments_multi"], t);
    EXPECT_EQ(fused_calls["adam_direction_multi"], t);
    EXPECT_TRUE(state["mu.w"].shares_storage(state["nu.k"]));
    EXPECT_EQ(state["mu.b"].impl()->storage.get(), moments_buffer) << "step " << t << ": not in place";
    const double step = lr / (1 - std::pow(b1, t)), sqrt_bc2 = std::sqrt(1 - std::pow(b2, t));
    for (const char* path : {"w", "b", "k"}) {
      const Array& g = grads[path];
      Array mt = add(mul(m["mu." + std::string(path)], b1), mul(g, 1 - b1));
      Array vt = add(mul(v["nu." + std::string(path)], b2), mul(square(g), 1 - b2));
      m.set("mu." + std::string(path), mt);
      v.set("nu." + std::string(path), vt);
      Array u = mul(div(mt, add(div(sqrt(vt), sqrt_bc2), eps)), -step);
      if (std::string(path) != "b") u = sub(u, mul(ref[path], lr * wd));
      ref.set(path, add(ref[path], u));
      EXPECT_EQ(max_abs_diff(params[path], ref[path]), 0.0) << path << " step " << t;
      EXPECT_EQ(max_abs_diff(state["mu." + std::string(path)], mt), 0.0) << path << " step " << t;
      EXPECT_EQ(max_abs_diff(state["nu." + std::string(path)], vt), 0.0) << path << " step " << t;
    }
  }
  prim::set_op_observer(previous);
}

// Moved in, the gradients' buffers take the updates: AdamW's step allocates nothing beyond
// its few scalars (a flat update buffer needed one free range the size of all parameters,
// which a fragmented arena often lacked). A gradient the caller kept is left alone.
TEST(Optim, FusedAdamWWritesItsUpdatesOverMovedInGradients) {
  Params params{{"w", random_normal({512, 384}, 1)}, {"u", random_normal({384, 256}, 2)}, {"b", random_normal({384}, 3)}};
  optim::Transform opt = optim::adamw(optim::constant_schedule(1e-3));
  Params state = opt.init(params);
  for (int t = 1; t <= 2; ++t) {
    Params grads{{"w", random_normal({512, 384}, 10 + t)},
                 {"u", random_normal({384, 256}, 20 + t)},
                 {"b", random_normal({384}, 30 + t)}};
    const Params kept{{"u", grads["u"]}};  // the caller holds on to this one
    std::map<std::string, const void*> buffers;
    for (const auto& [path, g] : grads) buffers[path] = g.impl()->storage.get();
    CachingAllocator& allocator = CachingAllocator::instance();
    const size_t before = allocator.stats().bytes_in_use;
    allocator.reset_peak();
    const Params updates = opt.update(std::move(grads), state, params);
    const size_t grown = allocator.stats().peak_bytes_in_use - before;
    EXPECT_EQ(updates["w"].impl()->storage.get(), buffers["w"]) << "step " << t;
    EXPECT_EQ(updates["b"].impl()->storage.get(), buffers["b"]) << "step " << t;
    EXPECT_NE(updates["u"].impl()->storage.get(), buffers["u"]) << "step " << t << ": wrote over a kept gradient";
    EXPECT_NE(max_abs_diff(kept["u"], updates["u"]), 0.0);
    // Only u's update (the kept gradient's) and small arrays are new.
    EXPECT_LE(grown, size_t(384 * 256 * 4) + (size_t(64) << 10)) << "step " << t;
    params = optim::apply_updates(std::move(params), updates);
  }
}

// A captured CUDA graph replays its launches as recorded, so nothing that changes from step to
// step may ride in them. AdamW's step size, bias correction and decay sit in one small buffer
// the transform rewrites before each step; the kernels read it at run time.
TEST(Optim, AdamWReadsItsPerStepValuesFromOneBuffer) {
  Params params{{"w", random_normal({6, 5}, 1)}, {"b", random_normal({5}, 2)}};
  const double b1 = 0.9, b2 = 0.999, wd = 0.01;
  const optim::Schedule lr = optim::warmup_linear_decay_schedule(1e-3, 2, 6);  // a new rate every step
  optim::Transform opt = optim::adamw(lr, b1, b2, 1e-8, wd);
  Params state = opt.init(params);
  const void* buffer = nullptr;
  std::vector<float> seen;
  prim::OpObserver previous = prim::set_op_observer([&](const prim::OpEvent& e) {
    if (std::string(e.primitive.name()) != "adam_direction_multi") return;
    const Array& scalars = e.inputs[3 * ((e.inputs.size() - 1) / 4)];  // after m, v, p; before the destinations
    if (!buffer) buffer = scalars.raw();
    EXPECT_EQ(scalars.raw(), buffer) << "the step's scalars moved";
    const float* s = scalars.data<float>();  // a CPU array: read in place
    seen.assign(s, s + scalars.numel());
  });
  for (int t = 1; t <= 4; ++t) {
    Params grads{{"w", random_normal({6, 5}, 10 + t)}, {"b", random_normal({5}, 20 + t)}};
    params = optim::apply_updates(params, opt.update(grads, state, params));
    const double rate = lr(t - 1);
    EXPECT_EQ(seen.size(), 3u);
    if (seen.size() != 3u) break;
    EXPECT_EQ(seen[0], float(rate / (1 - std::pow(b1, t)))) << "step size, step " << t;
    EXPECT_EQ(seen[1], float(std::sqrt(1 - std::pow(b2, t)))) << "bias correction, step " << t;
    EXPECT_EQ(seen[2], float(rate * wd)) << "decay, step " << t;
  }
  prim::set_op_observer(previous);
}

// The direction kernels take only the run's constants from their call: the same call with its
// scalars buffer rewritten for another step computes that step's update.
TEST(Optim, AdamDirectionTakesTheStepFromItsBuffer) {
  auto step_at = [](int t, double lr) {
    AdamStep s;
    s.step_size = lr / (1 - std::pow(s.b1, t));
    s.sqrt_bc2 = std::sqrt(1 - std::pow(s.b2, t));
    s.decay = lr * 0.01;
    return s;
  };
  const AdamStep early = step_at(2, 1e-4), late = step_at(9, 3e-3);
  const std::vector<Array> m = {random_normal({4, 3}, 1), random_normal({7}, 2)};
  const std::vector<Array> v = {mul(square(random_normal({4, 3}, 3)), 0.01), mul(square(random_normal({7}, 4)), 0.01)};
  const std::vector<Array> p = {random_normal({4, 3}, 5), random_normal({7}, 6)};
  const Array expected = adam_direction_multi(m, v, p, late, {true, false}, adam_step_scalars(late, Device::cpu()));
  const Array scalars = adam_step_scalars(early, Device::cpu());
  const Array before = adam_direction_multi(m, v, p, early, {true, false}, scalars);
  write_adam_step_scalars(scalars, late);
  const Array after = adam_direction_multi(m, v, p, early, {true, false}, scalars);
  EXPECT_GT(max_abs_diff(before, expected), 1e-4);
  EXPECT_EQ(max_abs_diff(after, expected), 0.0);
  expect_error([&] { adam_direction_multi(m, v, p, late, {true, false}, Array::zeros({2})); },
               {"[adam_direction_multi]", "scalars", "f32(2,)"});
}

// Composite transforms hand their inner transform its state by moving it out, so a chained
// AdamW (the apps' chain(clip, adamw)) also updates its moments in place, step after step.
TEST(Optim, ChainedAdamWUpdatesItsMomentsInPlace) {
  Params params{{"w", random_normal({8, 4}, 1)}, {"b", random_normal({4}, 2)}};
  optim::Transform opt =
      optim::chain({optim::clip_by_global_norm(0.5), optim::adamw(optim::constant_schedule(1e-3))});
  Params state = opt.init(params);
  const void* buffer = state["1.mu.w"].impl()->storage.get();
  for (int t = 1; t <= 3; ++t) {
    Params grads{{"w", random_normal({8, 4}, 10 + t)}, {"b", random_normal({4}, 20 + t)}};
    params = optim::apply_updates(params, opt.update(grads, state, params));
    EXPECT_EQ(state["1.mu.w"].impl()->storage.get(), buffer) << "step " << t;
    EXPECT_TRUE(state["1.nu.b"].shares_storage(state["1.mu.w"]));
  }
}

// Gradients moved into the optimizer are clipped in their own buffers (no gradient-sized copy),
// to the values a copy gets; gradients the caller keeps are left as they were.
TEST(Optim, ClippingMovedGradientsScalesThemInPlace) {
  const optim::Transform clip = optim::clip_by_global_norm(0.5);
  Params none;
  const Params params{{"w", random_normal({8, 4}, 1)}};
  const Params kept{{"w", random_normal({8, 4}, 7)}};
  const std::vector<float> before = kept["w"].to_floats();
  const Params copied = clip.update(kept, none, params);
  EXPECT_EQ(kept["w"].to_floats(), before) << "the caller's gradients changed";
  EXPECT_NE(copied["w"].impl()->storage.get(), kept["w"].impl()->storage.get());
  Params moved{{"w", random_normal({8, 4}, 7)}};
  const void* buffer = moved["w"].impl()->storage.get();
  const Params clipped = clip.update(std::move(moved), none, params);
  EXPECT_EQ(clipped["w"].impl()->storage.get(), buffer) << "a moved-in gradient was copied";
  EXPECT_EQ(clipped["w"].to_floats(), copied["w"].to_floats());
}

// The global norm and the clipping scale run as one multi-tensor call per dtype (two calls per
// step for a tree of f32 and bf16 gradients, where the composed ops took four per tensor), to
// the composed ops' values: the norm within f64 summation order, the scaled gradients
// bit for bit (the same f32 product of each element and the rounded coefficient).
TEST(Optim, ClippingIsOneMultiTensorPassPerDtype) {
  Params grads{{"w", random_normal({37, 190}, 1)},
               {"b", random_normal({19}, 2)},
               {"e", cast(random_normal({3, 2, 5}, 3), DType::bf16)},
               {"k", random_normal({5000}, 4)}};
  double composed = 0;
  for (const auto& [path, g] : grads) composed += double(sum(square(cast(g, DType::f32))).item());
  std::map<std::string, int> calls;
  prim::OpObserver previous = prim::set_op_observer([&](const prim::OpEvent& e) { ++calls[e.primitive.name()]; });
  const double norm = double(global_norm(grads).item());
  EXPECT_EQ(calls["sum_squares_multi"], 2);  // f32, then bf16
  EXPECT_EQ(calls["square"], 0);
  EXPECT_NEAR(norm, std::sqrt(composed), 1e-6 * std::sqrt(composed));

  const double max_norm = 0.25 * norm;
  const float coef = float(max_norm / (double(float(norm)) + 1e-6));
  Params copies;
  for (const auto& [path, g] : grads) copies.set(path, add(g, 0.0));
  calls.clear();
  Params no_state;
  const Params clipped = clip_by_global_norm(max_norm).update(std::move(copies), no_state, grads);
  prim::set_op_observer(previous);
  EXPECT_EQ(calls["scale_multi"], 2);
  EXPECT_EQ(calls["mul"], 0);
  for (const auto& [path, g] : grads) {
    SCOPED_TRACE(path);
    const Array expected = g.dtype() == DType::f32 ? mul(g, Array::scalar(coef, DType::f32))
                                                   : cast(mul(cast(g, DType::f32), Array::scalar(coef, DType::f32)), g.dtype());
    EXPECT_EQ(max_abs_diff(clipped[path], expected), 0.0);
  }

  // The updates' application: one add_multi per dtype, in the parameters' own buffers when they
  // are moved in, equal to the per-tensor add bit for bit.
  Params params;
  for (const auto& [path, g] : grads) params.set(path, add(g, 1.0));
  std::map<std::string, const void*> buffers;
  for (const auto& [path, p] : params) buffers[path] = p.impl()->storage.get();
  calls.clear();
  previous = prim::set_op_observer([&](const prim::OpEvent& e) { ++calls[e.primitive.name()]; });
  const Params updated = apply_updates(std::move(params), clipped);
  prim::set_op_observer(previous);
  EXPECT_EQ(calls["add_multi"], 2);
  EXPECT_EQ(calls["add"], 0);
  for (const auto& [path, g] : grads) {
    SCOPED_TRACE(path);
    EXPECT_EQ(updated[path].impl()->storage.get(), buffers[path]) << "not updated in place";
    EXPECT_EQ(max_abs_diff(updated[path], add(add(g, 1.0), clipped[path])), 0.0);
  }
  expect_error([] { add_multi_into({Array::zeros({2})}, {Array::zeros({3})}); }, {"[add_multi]", "f32(2,) + f32(3,)"});
  expect_error([] { sum_of_squares_multi({Array::zeros({2}), Array::zeros({2}, DType::bf16)}); },
               {"[sum_squares_multi]", "one dtype and device"});
  expect_error([] { scale_multi_into({Array::zeros({2})}, Array::zeros({2})); },
               {"[scale_multi]", "f32 array of one element", "f32(2,)"});
  expect_error([] { sum_of_squares_multi({}); }, {"[sum_squares_multi]", "no tensors"});
}

}  // namespace
}  // namespace mt::testing
