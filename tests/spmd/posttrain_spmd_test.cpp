// Post-training under SPMD (np 1, 2, 4; on 4 ranks data=2,model=2): two Trainer steps of
// DPO (LoRA with the base as reference, and full weights with a frozen copy), of
// distillation (the teacher laid out by its own rules) and of a GRPO update on fixed rollouts
// equal the one-process computation — losses, recorded metrics and parameters; and the
// engine's seeded samples from the sharded parameters equal those from whole ones.
#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include "meshtrain/distributed/spmd.h"
#include "meshtrain/models/peft_adapter.h"
#include "meshtrain/optim/partition.h"
#include "meshtrain/posttrain/distillation.h"
#include "meshtrain/posttrain/dpo.h"
#include "meshtrain/posttrain/grpo.h"
#include "meshtrain/posttrain/preference_data.h"
#include "meshtrain/posttrain/sampling.h"
#include "meshtrain/posttrain/token_logprobs.h"
#include "meshtrain/train/step_metrics.h"
#include "meshtrain/train/trainer.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

using json = nlohmann::json;
constexpr int64_t kVocab = 64, kBatch = 4;

std::string test_mesh() { return dist::world().size() == 4 ? "data=2,model=2" : "data=" + std::to_string(dist::world().size()); }

std::shared_ptr<models::PretrainedModel> gpt2(int64_t width, int64_t layers, uint64_t seed, bool lora) {
  const json c = {{"model_type", "gpt2"}, {"vocab_size", kVocab}, {"n_positions", 32}, {"n_embd", width},
                  {"n_layer", layers},     {"n_head", 4}};
  models::PretrainedOptions po;
  po.init_key = RngKey{seed, 0};
  auto m = std::make_shared<models::PretrainedModel>(models::init_model(c, po));
  if (lora) {
    models::LoraOptions o;
    o.rank = 4, o.alpha = 8.0;
    models::add_lora(*m, o, RngKey{seed + 1, 0});
  }
  return m;
}

optim::Transform optimizer(bool lora) {
  optim::Transform adamw = optim::adamw(optim::constant_schedule(1e-2));
  if (!lora) return optim::chain({optim::clip_by_global_norm(1.0), adamw});
  return optim::chain({optim::clip_by_global_norm(1.0),
                       optim::partition({{models::lora_parameter_pattern(), adamw}, {".*", optim::freeze()}})});
}

train::Batch local_slice(const train::Batch& b, const train::Deployer& d) {
  train::Batch out;
  for (const auto& [name, a] : b) {
    const int64_t n = a.dim(0) / d.data_size();
    out.set(name, slice(a, 0, d.data_index() * n, (d.data_index() + 1) * n));
  }
  return out;
}

struct StepsRun {
  std::vector<double> losses;
  std::vector<std::map<std::string, double>> metrics;
  Params params;
};

// One process: the Trainer's step written out on whole arrays.
StepsRun reference(const train::LossFn& loss, const Params& start, const optim::Transform& opt, const std::vector<train::Batch>& batches,
              const train::Deployer& deployer) {
  Params params = start, state = opt.init(params);
  StepsRun r;
  for (size_t s = 0; s < batches.size(); ++s) {
    // The Trainer's key: micro-batch 0, the step folded in last from a device scalar.
    const RngKey key = deployer.step_key_root().fold_in(0).folding_last(Array::scalar(double(s), DType::i64, Device::cpu()));
    auto [trainable, frozen] = optim::split_frozen(opt, params);
    train::MetricRecorder recorder;
    std::map<std::string, Array> recorded;
    auto [value, grads] = value_and_grad([&](const Params& t) {
      Params all = frozen;
      for (const auto& [path, v] : t) all.set(path, v);
      Array l = loss(all, batches[s], key, true);
      recorded = recorder.take();
      return l;
    })(trainable);
    params = optim::apply_updates(params, opt.update(grads, state, params));
    r.losses.push_back(value.item());
    std::map<std::string, double> m;
    for (const auto& [k, v] : recorded) m[k] = v.item();
    r.metrics.push_back(m);
  }
  r.params = params;
  return r;
}

// The same steps by a Trainer over the test mesh; prints and checks the largest difference.
void expect_trainer_equals_reference(const std::string& label, const train::LossFn& loss, const Params& start, bool lora,
                                     const models::ParamRoles& roles, const std::vector<train::Batch>& batches) {
  train::Deployer deployer({.seed = 1, .mesh = test_mesh(), .workdir = "runs/posttrain_spmd", .verbose = false});
  const StepsRun ref = reference(loss, start, optimizer(lora), batches, deployer);
  auto unused_collate = [](const std::vector<data::Example>&) -> train::Batch { return {}; };
  train::Trainer trainer(deployer, unused_collate, loss, start, optimizer(lora), deployer.sharding_rules(start, roles));
  double err = 0;
  for (size_t s = 0; s < batches.size(); ++s) {
    const double l = trainer.train({deployer.shard_batch(local_slice(batches[s], deployer))});
    err = std::max(err, std::abs(l - ref.losses[s]));
    for (const auto& [k, v] : ref.metrics[s]) err = std::max(err, std::abs(trainer.last_step_metrics().at(k) - v));
  }
  double moved = 0;
  for (const auto& [path, w] : start) {
    const Array got = dist::to_host(trainer.params()[path]);
    err = std::max(err, max_abs_diff(got, ref.params[path]));
    moved = std::max(moved, max_abs_diff(got, w));
  }
  if (dist::world().rank() == 0)
    std::cout << "  [max err] " << label << " on " << test_mesh() << " vs one process (losses " << ref.losses.front() << " -> "
              << ref.losses.back() << ", " << ref.metrics.front().size() << " metrics): " << err << "\n";
  EXPECT_LE(err, 2e-5) << label;
  EXPECT_GT(moved, 1e-4) << label << ": nothing trained";
}

std::vector<data::Example> preference_pairs() {
  std::mt19937 rng(3);
  auto ids = [&](int n) {
    std::vector<int64_t> v;
    for (int i = 0; i < n; ++i) v.push_back(int64_t(rng() % (kVocab - 1)) + 1);
    return v;
  };
  std::vector<data::Example> ex;
  for (int i = 0; i < kBatch; ++i) ex.push_back(posttrain::preference_example({ids(3 + i), ids(2 + i % 3), ids(4 - i % 2)}, 12, 0));
  return ex;
}

TEST(PosttrainSpmd, DpoStepsEqualOneProcess) {
  const train::Batch batch = posttrain::preference_collate()(preference_pairs());
  posttrain::DpoOptions o;
  o.beta = 0.5, o.rpo_alpha = 0.5;
  {
    auto m = gpt2(32, 2, 5, true);
    expect_trainer_equals_reference("DPO, LoRA, base as reference", posttrain::dpo_loss_fn(m, {}, o), m->params, true,
                                    m->param_roles(), {batch, batch});
  }
  {
    auto m = gpt2(32, 2, 7, false);
    train::Deployer deployer({.seed = 1, .mesh = test_mesh(), .workdir = "runs/posttrain_spmd", .verbose = false});
    const train::ShardingPlan plan = deployer.sharding_rules(m->params, m->param_roles());
    // The frozen copy in the policy's layout; the reference run gets whole arrays.
    posttrain::DpoReference sharded = posttrain::DpoReference::frozen_copy(m->params, &plan);
    posttrain::DpoReference whole = posttrain::DpoReference::frozen_copy(m->params, nullptr);
    const StepsRun ref = reference(posttrain::dpo_loss_fn(m, whole, o), m->params, optimizer(false), {batch, batch}, deployer);
    auto unused_collate = [](const std::vector<data::Example>&) -> train::Batch { return {}; };
    train::Trainer trainer(deployer, unused_collate, posttrain::dpo_loss_fn(m, sharded, o), m->params, optimizer(false), plan);
    double err = 0;
    for (int s = 0; s < 2; ++s)
      err = std::max(err, std::abs(trainer.train({deployer.shard_batch(local_slice(batch, deployer))}) - ref.losses[size_t(s)]));
    for (const auto& [path, w] : m->params) err = std::max(err, max_abs_diff(dist::to_host(trainer.params()[path]), ref.params[path]));
    if (dist::world().rank() == 0) std::cout << "  [max err] DPO, full weights, frozen copy on " << test_mesh() << ": " << err << "\n";
    EXPECT_LE(err, 2e-5);
    EXPECT_NEAR(ref.losses[0] - ref.metrics[0].at("nll_loss") * 0.5, std::log(2.0), 1e-6);
  }
}

TEST(PosttrainSpmd, DistillationStepsEqualOneProcess) {
  auto teacher = gpt2(48, 2, 11, false), student = gpt2(16, 1, 12, false);
  train::Deployer deployer({.seed = 1, .mesh = test_mesh(), .workdir = "runs/posttrain_spmd", .verbose = false});
  const Params laid = deployer.sharding_rules(teacher->params, teacher->param_roles()).shard(teacher->params);
  posttrain::DistillOptions o;
  o.temperature = 2.0, o.alpha = 0.6;
  std::vector<int64_t> labels = random_ints({kBatch, 10}, 14, 0, kVocab).to_ints();
  labels[0] = labels[11] = -100;
  const train::Batch batch{{"input_ids", random_ints({kBatch, 10}, 13, 0, kVocab)}, {"labels", Array::from_vector(labels, {kBatch, 10})}};
  const StepsRun ref = reference(posttrain::distillation_loss_fn(student, teacher, teacher->params, o), student->params,
                            optimizer(false), {batch, batch}, deployer);
  auto unused_collate = [](const std::vector<data::Example>&) -> train::Batch { return {}; };
  train::Trainer trainer(deployer, unused_collate, posttrain::distillation_loss_fn(student, teacher, laid, o), student->params,
                         optimizer(false), deployer.sharding_rules(student->params, student->param_roles()));
  double err = 0;
  for (int s = 0; s < 2; ++s) {
    err = std::max(err, std::abs(trainer.train({deployer.shard_batch(local_slice(batch, deployer))}) - ref.losses[size_t(s)]));
    for (const char* k : {"kl", "ce_loss"}) err = std::max(err, std::abs(trainer.last_step_metrics().at(k) - ref.metrics[size_t(s)].at(k)));
  }
  for (const auto& [path, w] : student->params) err = std::max(err, max_abs_diff(dist::to_host(trainer.params()[path]), ref.params[path]));
  if (dist::world().rank() == 0)
    std::cout << "  [max err] distillation (teacher laid out by its own rules) on " << test_mesh() << ": " << err << "\n";
  EXPECT_LE(err, 2e-5);
}

TEST(PosttrainSpmd, GrpoUpdateOnFixedRolloutsEqualsOneProcess) {
  auto m = gpt2(32, 2, 21, true);
  const int64_t n = 8, t = 9;  // 2 prompts x G 4 per data... 8 completions in all
  std::vector<int64_t> labels = random_ints({n, t}, 22, 0, kVocab).to_ints();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < t; ++j)
      if (j < 3 || j >= t - i % 3) labels[size_t(i * t + j)] = -100;  // prompt and padding
  train::Batch batch{{"input_ids", random_ints({n, t}, 23, 0, kVocab)},
                     {"labels", Array::from_vector(labels, {n, t})},
                     {"advantages", Array::from_vector(std::vector<double>{1.1, -0.3, -0.8, 0.0, 0.5, 0.9, -1.2, -0.2}, {n})}};
  // The sampling policy's and the reference's log-probabilities: the model's own, shifted.
  const Array own = posttrain::decoder_token_logprobs(*m, m->params, {.input_ids = batch["input_ids"]}, batch["labels"], {}, false);
  batch.set("old_logps", add(own, mul(random_uniform({n, t}, 24, -0.3, 0.3), posttrain::target_mask(batch["labels"]))));
  batch.set("ref_logps", add(own, mul(random_uniform({n, t}, 25, -0.2, 0.2), posttrain::target_mask(batch["labels"]))));
  posttrain::GrpoOptions o;
  o.beta = 0.04, o.num_iterations = 2, o.temperature = 0.9;
  expect_trainer_equals_reference("GRPO update on fixed rollouts", posttrain::grpo_loss_fn(m, o), m->params, true,
                                  m->param_roles(), {batch, batch});
}

TEST(PosttrainSpmd, SeededSamplesFromShardedParametersEqualWholeOnes) {
  auto m = gpt2(32, 2, 31, false);
  train::Deployer deployer({.seed = 1, .mesh = test_mesh(), .workdir = "runs/posttrain_spmd", .verbose = false});
  const Params laid = deployer.sharding_rules(m->params, m->param_roles()).shard(m->params);
  posttrain::SamplingOptions so;
  so.n = 4, so.max_new_tokens = 8, so.temperature = 1.0, so.seed = 9, so.stop_tokens = {0};
  const std::vector<std::vector<int64_t>> prompts{{3, 4, 5}, {7}, {8, 9}};
  const posttrain::SampledCompletions whole = posttrain::sample_completions(*m, m->params, prompts, so);
  const posttrain::SampledCompletions sharded = posttrain::sample_completions(*m, laid, prompts, so);
  EXPECT_EQ(sharded.tokens, whole.tokens);
  // Every rank holds rank 0's samples.
  int64_t total = 0;
  for (const auto& c : sharded.tokens) total += int64_t(c.size()) + c.front();
  int64_t max_total = total;
  dist::world().all_reduce(&max_total, 1, DType::i64, dist::ReduceOp::max);
  EXPECT_EQ(total, max_total);
  if (dist::world().rank() == 0)
    std::cout << "  seeded samples on " << test_mesh() << ": " << sharded.generated_tokens << " tokens, equal to one process's\n";
}

}  // namespace
}  // namespace mt::testing
