// LoRA under SPMD: on data=2,model=2 every adapter takes its base weight's layout (A split
// like the weight's input features, B like its outputs: column-parallel q/k/v and MLP-in
// split B, row-parallel out-projections split A), and three Trainer steps of a LoRA GPT-2
// and LLaMA (base frozen by optim::partition, adapter dropout on) give the one-process
// run's losses and adapters, with the base weights bit for bit unchanged, with and without
// blocks and the head recomputed in backward.
#include <gtest/gtest.h>

#include <iostream>

#include "meshtrain/distributed/spmd.h"
#include "meshtrain/models/peft_adapter.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/optim/partition.h"
#include "meshtrain/train/trainer.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

using dist::PartitionSpec;
using json = nlohmann::json;

constexpr int64_t kBatch = 4, kTime = 8, kVocab = 64;

std::string test_mesh() { return dist::world().size() == 4 ? "data=2,model=2" : "data=" + std::to_string(dist::world().size()); }

models::PretrainedModel lora_model(const json& config) {
  models::PretrainedOptions po;
  po.init_key = RngKey{5, 0};
  models::PretrainedModel m = models::init_model(config, po);
  models::LoraOptions o;
  o.rank = 4, o.alpha = 8.0, o.dropout = 0.1;
  models::add_lora(m, o, RngKey{6, 0});
  return m;
}

json gpt2_config() {
  return {{"model_type", "gpt2"}, {"vocab_size", kVocab}, {"n_positions", 16}, {"n_embd", 32}, {"n_layer", 2},
          {"n_head", 4}};
}
json llama_config() {
  return {{"model_type", "llama"},       {"vocab_size", kVocab},       {"hidden_size", 32},
          {"intermediate_size", 64},     {"num_hidden_layers", 2},     {"num_attention_heads", 4},
          {"num_key_value_heads", 2}};
}

optim::Transform lora_optimizer() {
  return optim::chain({optim::clip_by_global_norm(1.0),
                       optim::partition({{models::lora_parameter_pattern(), optim::adamw(optim::constant_schedule(1e-2))},
                                         {".*", optim::freeze()}})});
}

// The batch every rank knows; each collates its data slice.
train::Batch global_batch(uint64_t seed) {
  return {{"ids", random_ints({kBatch, kTime}, seed, 0, kVocab)}, {"labels", random_ints({kBatch, kTime}, seed + 1, 0, kVocab)}};
}

train::Batch local_slice(const train::Batch& b, int index, int count) {
  train::Batch out;
  const int64_t n = kBatch / count;
  for (const auto& [name, a] : b) out.set(name, slice(a, 0, index * n, (index + 1) * n));
  return out;
}

TEST(LoraSpmd, AdaptersFollowTheirBaseWeightsLayout) {
  if (dist::world().size() != 4) GTEST_SKIP() << "layouts are checked on data=2,model=2";
  train::Deployer deployer({.seed = 1, .mesh = test_mesh(), .workdir = "runs/lora_spmd", .verbose = false});
  const PartitionSpec rows{"model", ""}, cols{"", "model"}, none{"", ""};
  {
    models::PretrainedModel m = lora_model(llama_config());
    train::ShardingPlan plan = deployer.sharding_rules(m.params, m.param_roles());
    if (dist::world().rank() == 0) std::cout << plan.table();
    const std::string l = "model.layers.1.";
    EXPECT_EQ(plan.spec(l + "self_attn.q_proj.weight"), rows);
    EXPECT_EQ(plan.spec(l + "self_attn.q_proj.lora_A.weight"), none);  // column-parallel: A whole
    EXPECT_EQ(plan.spec(l + "self_attn.q_proj.lora_B.weight"), rows);  // B split like W's outputs
    EXPECT_EQ(plan.spec(l + "self_attn.o_proj.weight"), cols);
    EXPECT_EQ(plan.spec(l + "self_attn.o_proj.lora_A.weight"), cols);  // row-parallel: A split like W's inputs
    EXPECT_EQ(plan.spec(l + "self_attn.o_proj.lora_B.weight"), none);
    EXPECT_EQ(plan.spec(l + "mlp.down_proj.lora_A.weight"), cols);
    EXPECT_EQ(plan.spec(l + "mlp.up_proj.lora_B.weight"), rows);
  }
  {
    models::PretrainedModel m = lora_model(gpt2_config());
    train::ShardingPlan plan = deployer.sharding_rules(m.params, m.param_roles());
    const std::string h = "transformer.h.0.";
    EXPECT_EQ(plan.spec(h + "attn.c_attn.lora_B.weight"), (PartitionSpec{"", "model", ""}));  // [3, out, r]
    EXPECT_EQ(plan.spec(h + "attn.c_attn.lora_A.weight"), none);
    EXPECT_EQ(plan.spec(h + "attn.c_proj.weight"), rows);  // Conv1D [in, out], row-parallel
    EXPECT_EQ(plan.spec(h + "attn.c_proj.lora_A.weight"), cols);
    EXPECT_EQ(plan.spec(h + "mlp.c_fc.lora_B.weight"), rows);
  }
}

struct ReferenceRun {
  std::vector<double> losses;
  Params params;
};

// The reference: one process, plain arrays, the Trainer's step written out.
ReferenceRun reference(const models::PretrainedModel& m, const train::Deployer& deployer, const std::vector<train::Batch>& batches) {
  optim::Transform opt = lora_optimizer();
  Params params = m.params, state = opt.init(params);
  ReferenceRun r;
  for (size_t s = 0; s < batches.size(); ++s) {
    // The Trainer's key: micro-batch 0, the step folded in last from a device scalar.
    const RngKey key = deployer.step_key_root().fold_in(0).folding_last(Array::scalar(double(s), DType::i64, Device::cpu()));
    auto [trainable, frozen] = optim::split_frozen(opt, params);
    auto [loss, grads] = value_and_grad([&](const Params& t) {
      Params all = frozen;
      for (const auto& [path, v] : t) all.set(path, v);
      return cross_entropy(m.decoder_logits(all, {.input_ids = batches[s]["ids"]}, key, true), batches[s]["labels"]);
    })(trainable);
    params = optim::apply_updates(params, opt.update(grads, state, params));
    r.losses.push_back(loss.item());
  }
  r.params = params;
  return r;
}

TEST(LoraSpmd, TrainerStepsEqualOneProcessAndLeaveTheBaseUntouched) {
  train::Deployer deployer({.seed = 1, .mesh = test_mesh(), .workdir = "runs/lora_spmd", .verbose = false});
  for (const json& config : {gpt2_config(), llama_config()}) {
    auto m = std::make_shared<models::PretrainedModel>(lora_model(config));
    SCOPED_TRACE(m->model_type);
    std::vector<train::Batch> batches(3, global_batch(10));  // one batch thrice: its loss must fall
    ReferenceRun ref = reference(*m, deployer, batches);
    // Tensor parallel alone, and with FSDP splitting base weights and adapters over data
    // too (threshold lowered so this small model's matrices qualify); each also with every
    // block recomputed in backward (--remat block), and the head's logits too, in chunks (full).
    for (bool fsdp : {false, true})
    for (Remat remat : {Remat::none, Remat::block, Remat::full}) {
    SCOPED_TRACE(std::string(fsdp ? "fsdp" : "tp") + " remat " + remat_name(remat));
    train::ShardingOptions so;
    so.fsdp = fsdp;
    so.fsdp_min_elements = 64;
    train::ShardingPlan plan = deployer.sharding_rules(m->params, m->param_roles(), so);
    int fsdp_adapters = 0;
    for (const auto& [path, v] : m->params)
      if (models::is_lora_path(path))
        fsdp_adapters += plan.spec(path).dim_of("data") >= 0;
    if (fsdp && deployer.data_size() > 1) {
      EXPECT_GT(fsdp_adapters, 0) << "no adapter is split over data under FSDP";
    }
    auto rm = std::make_shared<models::PretrainedModel>(*m);
    rm->config = m->config.with_remat(remat);
    auto loss = [rm](const Params& p, const train::Batch& b, const RngKey& key) {
      return rm->decoder_loss(p, {.input_ids = b["ids"]}, b["labels"], key, true);
    };
    auto unused_collate = [](const std::vector<data::Example>&) -> train::Batch { return {}; };  // batches come ready
    train::Trainer trainer(deployer, unused_collate, loss, m->params, lora_optimizer(), plan);
    // The optimizer keeps state for the adapters only.
    for (const auto& [path, v] : trainer.opt_state())
      EXPECT_TRUE(path == "1.0.count" || path.find("lora_") != std::string::npos) << path;
    std::vector<double> losses;
    for (const train::Batch& b : batches)
      losses.push_back(trainer.train({deployer.shard_batch(local_slice(b, deployer.data_index(), deployer.data_size()))}));

    double err = 0;
    for (size_t i = 0; i < losses.size(); ++i) err = std::max(err, std::abs(losses[i] - ref.losses[i]));
    int moved = 0;
    for (const auto& [path, w] : m->params) {
      Array got = dist::to_host(trainer.params()[path]);
      if (models::is_lora_path(path)) {
        err = std::max(err, max_abs_diff(got, ref.params[path]));
        moved += max_abs_diff(got, w) > 0;
      } else {
        EXPECT_EQ(max_abs_diff(got, w), 0.0) << path << " (frozen) changed";
        EXPECT_EQ(max_abs_diff(ref.params[path], w), 0.0) << path << " (frozen) changed in the reference";
      }
    }
    if (dist::world().rank() == 0)
      std::cout << "  [max err] LoRA " << m->model_type << " on " << test_mesh() << (fsdp ? " with FSDP" : "") << (remat == Remat::none ? "" : std::string(", remat ") + remat_name(remat))
                << " vs one process (losses "
                << ref.losses[0] << " -> " << ref.losses.back() << "): " << err << ", adapters moved " << moved << "\n";
    EXPECT_LE(err, 2e-5);
    int adapters = 0;
    for (const auto& [path, w] : m->params) adapters += models::is_lora_path(path);
    EXPECT_EQ(moved, adapters);  // every A and B moved
    EXPECT_EQ(adapters, m->model_type == "gpt2" ? 2 * 2 * 4 : 2 * 2 * 7);
    EXPECT_LT(ref.losses.back(), ref.losses.front());
    }
  }
}

}  // namespace
}  // namespace mt::testing
