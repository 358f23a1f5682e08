// f16 mixed precision and its dynamic loss scaling (optim/loss_scale.h): the scaler follows
// PyTorch GradScaler's rule; unscaling divides exactly and finds an inf or NaN in any
// gradient; scaling is what keeps small f16 gradients from flushing to zero; a Trainer under
// `f16` skips every step whose gradients overflow (parameters and AdamW state untouched),
// trains like f32 otherwise, logs its scale, and resumes with the scale it had.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/precision_policy.h"
#include "meshtrain/optim/loss_scale.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/models/gpt2.h"
#include "tests/support/model_twins.h"
#include "tests/support/next_token_batches.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using namespace mt::models;

TEST(LossScale, UpdateFollowsGradScalersRule) {
  optim::LossScaler s({.init_scale = 8, .growth_interval = 3});
  s.update(false);  // overflow: halve, count, restart the streak
  EXPECT_EQ(s.scale(), 4);
  EXPECT_EQ(s.skipped_steps(), 1);
  s.update(true), s.update(true);
  EXPECT_EQ(s.scale(), 4);
  EXPECT_EQ(s.growth_tracker(), 2);
  s.update(false);  // an overflow mid-streak restarts it
  EXPECT_EQ(s.scale(), 2);
  EXPECT_EQ(s.growth_tracker(), 0);
  for (int i = 0; i < 3; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 4);  // three finite steps in a row: doubled
  EXPECT_EQ(s.growth_tracker(), 0);
  // State round trip, as a checkpoint carries it.
  optim::LossScaler restored;
  restored.load_state(s.state());
  EXPECT_EQ(restored.scale(), 4);
  EXPECT_EQ(restored.skipped_steps(), 2);
  // A fixed scale stays, overflowing steps are still counted.
  optim::LossScaler fixed({.init_scale = 128, .dynamic = false});
  fixed.update(false);
  for (int i = 0; i < 5000; ++i) fixed.update(true);
  EXPECT_EQ(fixed.scale(), 128);
  EXPECT_EQ(fixed.skipped_steps(), 1);
  // A fixed scale is kept over a checkpoint's (a resume with --loss-scale N), the counters
  // restored; growth stops at f32's largest over f16's.
  fixed.load_state(s.state());
  EXPECT_EQ(fixed.scale(), 128);
  EXPECT_EQ(fixed.skipped_steps(), 2);
  optim::LossScaler high({.init_scale = 0x1p112, .growth_interval = 1});
  for (int i = 0; i < 10; ++i) high.update(true);
  EXPECT_EQ(high.scale(), 0x1p112) << "2^113 x 65504 would overflow f32";
  // Bad settings name themselves.
  expect_error([] { optim::LossScaler({.init_scale = 0}); }, {"[loss scale]", "positive", "0"});
  expect_error([] { optim::LossScaler({.init_scale = std::numeric_limits<double>::infinity()}); }, {"[loss scale]"});
  expect_error([] { optim::LossScaler({.init_scale = 1e300, .dynamic = false}); }, {"[loss scale]", "up to"});
  expect_error([] { optim::LossScaler({.growth_interval = 0}); }, {"[loss scale]", "interval", ">= 1"});
  expect_error([] { optim::LossScaler({.backoff_factor = 1.5}); }, {"[loss scale]", "backoff_factor"});
  expect_error([&] { restored.load_state(nlohmann::json{{"scale", -1.0}}); }, {"[loss scale]", "positive"});
  expect_error([&] { restored.load_state(nlohmann::json::object()); }, {"[loss scale]", "'scale'"});
}

TEST(LossScale, UnscaleDividesExactlyAndFindsAnyNonFiniteGradient) {
  const Array a = random_normal({7, 5}, 1), b = random_normal({33}, 2), c = random_normal({4}, 3, DType::bf16);
  optim::LossScaler s({.init_scale = 1024});
  Params g{{"a", a.clone()}, {"b", b.clone()}, {"c", c.clone()}};
  // Scale 1024 and 4 micro-batches: a division by 4096, exact for these values.
  ASSERT_TRUE(s.unscale(g, 4.0));
  for (const char* path : {"a", "b", "c"}) {
    const std::vector<float> got = g[path].to_floats(), was = Params{{"a", a}, {"b", b}, {"c", c}}[path].to_floats();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], was[i] / 4096.0f) << path << " " << i;
  }
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    for (const char* where : {"a", "b"}) {
      std::vector<float> v = (std::string(where) == "a" ? a : b).to_floats();
      v.back() = bad;  // the last element: the multi-tensor pass's tail
      Params h{{"a", a.clone()}, {"b", b.clone()}};
      h.set(where, Array::from_vector(v, h[where].shape()));
      EXPECT_FALSE(s.unscale(h, 1.0)) << where << " " << bad;
    }
  }
}

// The reason for the scale: a loss whose gradients are small (here multiplied by 1e-4) has f16
// activation gradients below f16's smallest subnormal (6e-8), which flush to zero; scaled by
// 2^16 first they survive, and the unscaled master gradients match f32's.
TEST(LossScale, ScalingKeepsSmallF16GradientsFromVanishing) {
  Gpt2Config cfg;
  cfg.vocab_size = 41, cfg.n_positions = 32, cfg.n_embd = 24, cfg.n_layer = 2, cfg.n_head = 4;
  const Params p = random_model_params(gpt2_param_defs(cfg), 4);
  const Array ids = random_ints({4, 16}, 5, 0, cfg.vocab_size), labels = random_ints({4, 16}, 6, 0, cfg.vocab_size);
  auto loss = [&](const Params& q) {
    return mul(cast(cross_entropy(gpt2_apply(cfg, q, {.input_ids = ids}), labels), DType::f32), 1e-4);
  };
  auto grads_under = [&](const std::string& precision, double scale) {
    PrecisionScope scope(precision_policy_from_name(precision));
    const PrecisionPolicy& policy = precision_policy();
    const Params compute = policy.cast_for_compute(p);
    auto [value, grads] = value_and_grad([&](const Params& m) {
      const Array l = loss(policy.compute_view(m, compute));
      return mul(l, scalar_like(l, scale));
    })(p);
    optim::LossScaler s({.init_scale = scale});
    EXPECT_TRUE(s.unscale(grads, 1.0)) << precision;
    return grads;
  };
  const Params f32 = grads_under("f32", 1.0), unscaled = grads_under("f16", 1.0), scaled = grads_under("f16", 65536.0);
  double err_unscaled = 0, err_scaled = 0, norm = 0;
  for (const auto& [path, g] : f32) {
    const std::vector<float> r = g.to_floats(), u = unscaled[path].to_floats(), s = scaled[path].to_floats();
    for (size_t i = 0; i < r.size(); ++i) {
      norm += double(r[i]) * r[i];
      err_unscaled += (double(u[i]) - r[i]) * (double(u[i]) - r[i]);
      err_scaled += (double(s[i]) - r[i]) * (double(s[i]) - r[i]);
    }
  }
  const double rel_unscaled = std::sqrt(err_unscaled / norm), rel_scaled = std::sqrt(err_scaled / norm);
  std::cout << "  [max err] f16 master gradients against f32 (relative L2): loss scale 1 " << rel_unscaled
            << ", loss scale 65536 " << rel_scaled << "\n";
  EXPECT_LT(rel_scaled, 1e-2);
  EXPECT_GT(rel_unscaled, 10 * rel_scaled) << "small gradients should have flushed to zero without a scale";
}

struct F16Run {
  std::vector<double> losses;
  std::vector<double> scales;  // metrics.jsonl's loss_scale per step
  int64_t skipped = 0;
  double final_scale = 0;
};

class LossScaledTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.vocab_size = 41, cfg_.n_positions = 32, cfg_.n_embd = 24, cfg_.n_layer = 2, cfg_.n_head = 4;
    for (int64_t i = 0; i < 48; ++i)
      rows_.push_back({{"tokens", random_ints({17}, 10 + uint64_t(i), 0, cfg_.vocab_size).to_ints()}});
    root_ = fs::temp_directory_path() / ("mt_loss_scale_" + std::to_string(getpid()));
  }
  void TearDown() override { fs::remove_all(root_); }

  train::Trainer make(train::Deployer& deployer) {
    return train::Trainer(deployer, next_token_collate(16), gpt2_next_token_loss(cfg_),
                          random_model_params(gpt2_param_defs(cfg_), 4),
                          optim::adamw(optim::constant_schedule(3e-3)));
  }
  // Trains under `precision` in root_/name; `hook` sees each step.
  F16Run run(const std::string& precision, const std::string& name, train::FitOptions o,
             const std::function<void(train::Trainer&)>& before = {}) {
    PrecisionScope scope(precision_policy_from_name(precision));
    train::Deployer deployer({.seed = 3, .workdir = (root_ / name).string(), .verbose = false});
    train::Trainer trainer = make(deployer);
    if (before) before(trainer);
    o.per_device_batch_size = 4;
    const train::FitResult r = trainer.fit(data::make_dataset(rows_), o);
    F16Run out;
    out.losses = r.losses;
    if (const optim::LossScaler* s = trainer.loss_scaler()) out.skipped = s->skipped_steps(), out.final_scale = s->scale();
    std::ifstream in(root_ / name / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("split", "") == "train" && j.contains("loss_scale")) out.scales.push_back(j["loss_scale"].get<double>());
    }
    return out;
  }

  Gpt2Config cfg_;
  std::vector<data::Example> rows_;
  fs::path root_;
};

// A first scale of 2^24 overflows f16's gradients: each such step is skipped — the parameters
// and AdamW's state exactly as the step before left them — and the scale halves; once the
// gradients fit, steps update again (and a later overflow is skipped the same way).
TEST_F(LossScaledTrainer, OverflowingStepsAreSkippedAndTheScaleShrinks) {
  PrecisionScope scope(precision_policy_from_name("f16"));
  train::Deployer deployer({.seed = 3, .workdir = (root_ / "skips").string(), .verbose = false});
  train::Trainer trainer = make(deployer);
  auto snapshot = [&](const Params& params) {
    std::vector<std::vector<float>> values;
    for (const auto& [path, v] : params) values.push_back(v.to_floats());
    for (const auto& [path, v] : trainer.opt_state()) values.push_back(v.to_floats());
    return values;
  };
  std::vector<std::vector<float>> before = snapshot(trainer.params());
  std::vector<bool> skipped_at, unchanged_at;  // per step: counted as skipped; state as before it
  std::vector<double> scale_after;
  int64_t skips_so_far = 0;
  train::FitOptions o;
  o.per_device_batch_size = 4, o.max_steps = 12;
  o.loss_scale = {.init_scale = std::ldexp(1.0, 24), .growth_interval = 1000};
  o.on_step = [&](int64_t, const Params& params) {
    const optim::LossScaler* s = trainer.loss_scaler();
    skipped_at.push_back(s->skipped_steps() > skips_so_far);
    skips_so_far = s->skipped_steps();
    scale_after.push_back(s->scale());
    std::vector<std::vector<float>> now = snapshot(params);
    unchanged_at.push_back(now == before);
    before = std::move(now);
  };
  const train::FitResult r = trainer.fit(data::make_dataset(rows_), o);
  const optim::LossScaler* s = trainer.loss_scaler();
  ASSERT_NE(s, nullptr);
  const int64_t skipped = s->skipped_steps();
  std::cout << "  " << skipped << " of 12 steps skipped from 2^24, scale now " << s->scale() << "\n";
  ASSERT_EQ(skipped_at.size(), 12u);
  EXPECT_TRUE(skipped_at[0] && skipped_at[1]) << "2^24 and 2^23 overflow at first";
  EXPECT_LT(skipped, 12) << "the scale never came down far enough";
  EXPECT_EQ(s->scale(), std::ldexp(1.0, 24 - int(skipped)));
  double scale = std::ldexp(1.0, 24);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(unchanged_at[i], bool(skipped_at[i])) << "step " << i + 1 << ": a skipped step changes nothing, "
                                                    << "an applied one changes the parameters";
    if (skipped_at[i]) scale /= 2;
    EXPECT_EQ(scale_after[i], scale) << "step " << i + 1;
  }
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l)) << "the reported loss is the unscaled one";
}

// Without overflow f16 trains like f32 (within f16's rounding, 11 bits), the scale doubling
// every 4 finite steps as logged; and its losses are not f32's (the policy took effect).
TEST_F(LossScaledTrainer, F16TrainsLikeF32AndLogsItsScale) {
  train::FitOptions o;
  o.max_steps = 12;
  o.loss_scale = {.init_scale = 1024, .growth_interval = 4};
  const F16Run f16 = run("f16", "f16", o), f32 = run("f32", "f32", o);
  ASSERT_EQ(f16.losses.size(), 12u);
  ASSERT_EQ(f32.losses.size(), 12u);
  double worst = 0, differs = 0;
  for (size_t i = 0; i < 12; ++i) {
    const double rel = std::abs(f16.losses[i] - f32.losses[i]) / f32.losses[i];
    worst = std::max(worst, rel), differs = std::max(differs, rel);
  }
  std::cout << "  [max err] f16 vs f32 losses over 12 steps (relative): " << worst << "\n";
  EXPECT_LT(worst, 5e-3);
  EXPECT_GT(differs, 1e-6) << "f16 losses equal to f32's: the policy did not take effect";
  EXPECT_EQ(f16.skipped, 0);
  EXPECT_EQ(f16.final_scale, 8192);
  EXPECT_EQ(f16.scales, (std::vector<double>{1024, 1024, 1024, 1024, 2048, 2048, 2048, 2048, 4096, 4096, 4096, 4096}));
  EXPECT_TRUE(f32.scales.empty()) << "f32 steps scale nothing";
  // Two micro-batches a step: the unscaling divides by both the scale and the count.
  o.grad_accum_steps = 2, o.max_steps = 6;
  const F16Run f16_accum = run("f16", "f16_accum", o), f32_accum = run("f32", "f32_accum", o);
  ASSERT_EQ(f16_accum.losses.size(), 6u);
  double accum_worst = 0;
  for (size_t i = 0; i < 6; ++i)
    accum_worst = std::max(accum_worst, std::abs(f16_accum.losses[i] - f32_accum.losses[i]) / f32_accum.losses[i]);
  std::cout << "  [max err] f16 vs f32 losses, 2 micro-batches a step (relative): " << accum_worst << "\n";
  EXPECT_LT(accum_worst, 5e-3);
}

// A resumed f16 run continues with the scale and growth streak it had: its losses and final
// scale equal an uninterrupted run's.
TEST_F(LossScaledTrainer, ResumeKeepsTheScale) {
  train::FitOptions o;
  o.loss_scale = {.init_scale = 512, .growth_interval = 2};
  o.save_every = 3;
  o.max_steps = 7;
  const F16Run whole = run("f16", "whole", o);
  o.max_steps = 3;
  run("f16", "parts", o);
  o.max_steps = 7;
  o.resume = true;
  const F16Run rest = run("f16", "parts", o);
  ASSERT_EQ(whole.losses.size(), 7u);
  ASSERT_EQ(rest.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rest.losses[i], whole.losses[3 + i]) << "step " << 4 + i;
  EXPECT_EQ(rest.final_scale, whole.final_scale);
  // Step by step, the growth streak included (a streak restarted at the resume would grow
  // a step later).
  ASSERT_EQ(whole.scales.size(), 7u);
  ASSERT_EQ(rest.scales.size(), 7u);  // the resumed metrics.jsonl keeps steps 1-3 and adds 4-7
  EXPECT_EQ(rest.scales, whole.scales);
  EXPECT_EQ(whole.final_scale, 512 * 8);  // grown after steps 2, 4 and 6
  std::ifstream meta(root_ / "parts" / "checkpoints" / "step_00000003" / "meta.json");
  ASSERT_TRUE(meta.good());
  const nlohmann::json m = nlohmann::json::parse(meta);
  EXPECT_EQ(m["extra"]["loss_scale"]["scale"].get<double>(), 1024) << m.dump();
}

}  // namespace
}  // namespace mt::testing
