// Encoder-decoders under SPMD: a small T5 (v1.1) and a small BART trained for three Trainer
// steps on data=2,model=2 (4 ranks; self- and cross-attention, MLPs and T5's position bias
// split by the automatic rules, the batch split over data) give the one-process run's losses
// and parameters, with and without FSDP; then beam search through the Predictor on the
// sharded weights predicts the same ids as generate_seq2seq on one process. Each data shard
// collates its own rows, so their padded source widths differ (the predict function gathers
// the sources as token lists).
#include <gtest/gtest.h>

#include <iostream>

#include "meshtrain/distributed/spmd.h"
#include "meshtrain/models/seq2seq_generate.h"
#include "meshtrain/optim/partition.h"
#include "meshtrain/train/seq2seq_task.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

using json = nlohmann::json;

constexpr int64_t kVocab = 48, kPad = 0, kEos = 1, kBatch = 8, kTarget = 6;

std::string test_mesh() { return dist::world().size() == 4 ? "data=2,model=2" : "data=" + std::to_string(dist::world().size()); }

std::shared_ptr<models::PretrainedModel> small_model(const std::string& type) {
  json config = models::model_spec(type).small_seq2seq_config(kVocab, kPad, kEos);
  // Narrower than the command's small config (this runs 4 ranks on 2 cores); dropout on,
  // so the sharded dropout masks are checked too.
  if (type == "t5") config.update({{"d_model", 32}, {"d_kv", 8}, {"d_ff", 48}, {"num_heads", 4}, {"dropout_rate", 0.1}});
  else config.update({{"d_model", 32}, {"encoder_ffn_dim", 48}, {"decoder_ffn_dim", 48}, {"dropout", 0.1}});
  models::PretrainedOptions po;
  po.init_key = RngKey{5, 0};
  po.print_report = false;
  return std::make_shared<models::PretrainedModel>(models::init_model(config, po));
}

// Sources of 3..9 tokens (so the attention masks pad), targets all kTarget long (so each
// data shard's mean loss has as many tokens as the other's, and their mean is the global mean).
std::vector<data::Example> rows(uint64_t seed, int64_t n) {
  std::vector<data::Example> out;
  std::vector<int64_t> v = random_ints({n * 16}, seed, 2, kVocab).to_ints();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = 3 + i % 7;
    data::Example e;
    e.set("source_ids", std::vector<int64_t>(v.begin() + i * 16, v.begin() + i * 16 + len));
    std::vector<int64_t> target(v.begin() + i * 16 + 9, v.begin() + i * 16 + 9 + kTarget - 1);
    target.push_back(kEos);
    e.set("labels", target);
    out.push_back(e);
  }
  return out;
}

train::Batch local_slice(const train::Batch& b, int index, int count) {
  train::Batch out;
  const int64_t n = kBatch / count;
  for (const auto& [name, a] : b) out.set(name, slice(a, 0, index * n, (index + 1) * n));
  return out;
}

optim::Transform optimizer() {
  return optim::chain({optim::clip_by_global_norm(1.0), optim::adamw(optim::constant_schedule(3e-3))});
}

struct ReferenceRun {
  std::vector<double> losses;
  Params params;
};

// One process, plain arrays, the Trainer's step written out (its dropout key included).
ReferenceRun reference(const models::PretrainedModel& m, const train::Deployer& deployer,
                       const std::vector<train::Batch>& batches) {
  optim::Transform opt = optimizer();
  Params params = m.params, state = opt.init(params);
  ReferenceRun r;
  for (size_t s = 0; s < batches.size(); ++s) {
    const train::Batch& b = batches[s];
    // The Trainer's key: micro-batch 0, the step folded in last from a device scalar.
    const RngKey key = deployer.step_key_root().fold_in(0).folding_last(Array::scalar(double(s), DType::i64, Device::cpu()));
    auto [loss, grads] = value_and_grad([&](const Params& p) {
      return m.seq2seq_loss(p, {.input_ids = b["input_ids"], .attention_mask = b["attention_mask"],
                                .decoder_input_ids = b["decoder_input_ids"]},
                            b["labels"], key, true);
    })(params);
    params = optim::apply_updates(params, opt.update(grads, state, params));
    r.losses.push_back(loss.item());
  }
  r.params = params;
  return r;
}

TEST(Seq2SeqSpmd, TrainingAndBeamSearchEqualOneProcess) {
  train::Deployer deployer({.seed = 1, .mesh = test_mesh(), .workdir = "runs/seq2seq_spmd", .verbose = false});
  for (const std::string type : {"t5", "bart"}) {
    SCOPED_TRACE(type);
    auto m = small_model(type);
    // T5 starts decoding from <pad>, BART from </s>.
    const train::CollateFn collate =
        train::seq2seq_collate({kPad, kEos, m->seq2seq_lm().decoder_start_token_id, 16, 16, ""});
    std::vector<train::Batch> batches = {collate(rows(10, kBatch)), collate(rows(20, kBatch)),
                                         collate(rows(10, kBatch))};
    const ReferenceRun ref = reference(*m, deployer, batches);
    for (bool fsdp : {false, true}) {
      SCOPED_TRACE(fsdp ? "fsdp" : "tp");
      train::ShardingOptions so;
      so.fsdp = fsdp;
      so.fsdp_min_elements = 64;
      train::ShardingPlan plan = deployer.sharding_rules(m->params, m->param_roles(), so);
      auto unused_collate = [](const std::vector<data::Example>&) -> train::Batch { return {}; };  // batches come ready
      train::Trainer trainer(deployer, unused_collate, train::seq2seq_loss_fn(m), m->params, optimizer(), plan);
      std::vector<double> losses;
      for (const train::Batch& b : batches)
        losses.push_back(trainer.train({deployer.shard_batch(local_slice(b, deployer.data_index(), deployer.data_size()))}));
      double loss_err = 0, param_err = 0;
      for (size_t i = 0; i < losses.size(); ++i)
        loss_err = std::max(loss_err, std::abs(losses[i] - ref.losses[i]) / std::abs(ref.losses[i]));
      for (const auto& [path, w] : ref.params)
        param_err = std::max(param_err, max_abs_diff(dist::to_host(trainer.params()[path]), w));
      if (dist::world().rank() == 0)
        std::cout << "  [max err] " << type << " on " << test_mesh() << (fsdp ? " with FSDP" : "")
                  << " vs one process (losses " << ref.losses[0] << " -> " << ref.losses.back()
                  << "): losses (relative) " << loss_err << ", parameters " << param_err << "\n";
      EXPECT_LE(loss_err, 2e-6);
      // Adam divides by sqrt(v): parameters whose gradients are near zero move by amounts
      // sensitive to the gradients' summation order (which differs between layouts and CPUs:
      // 7.5e-5 on an AVX2-only EPYC, of 3e-3 per step).
      EXPECT_LE(param_err, 1e-4);
      EXPECT_LT(ref.losses.back(), ref.losses.front());

      // Beam search on the sharded weights, every rank in step, vs one process.
      models::GenerationConfig g;
      g.max_new_tokens = 7, g.num_beams = 3, g.pad_token_id = kPad;
      train::Predictor<std::vector<int64_t>> predictor(
          deployer, collate, train::seq2seq_predict_fn(m, g, 0), [](const train::Batch& host) {
            const std::vector<int64_t> v = host["tokens"].to_ints();
            const int64_t n = host["tokens"].dim(0), w = host["tokens"].dim(1);
            std::vector<std::vector<int64_t>> out(static_cast<size_t>(n));
            for (int64_t r = 0; r < n; ++r)
              for (int64_t j = 0; j < w && v[size_t(r * w + j)] >= 0; ++j) out[size_t(r)].push_back(v[size_t(r * w + j)]);
            return out;
          });
      const std::vector<data::Example> eval_rows = rows(30, 6);
      const auto predicted = predictor.predict(trainer.params(), data::make_dataset(eval_rows), 2);
      models::PretrainedModel one = *m;
      one.params = ref.params;
      std::vector<std::vector<int64_t>> sources;
      for (const auto& e : eval_rows) sources.push_back(e.tokens("source_ids"));
      const models::GenerationResult expected = models::generate_seq2seq(one.seq2seq_lm(), sources, g);
      ASSERT_EQ(predicted.size(), sources.size());
      int same = 0;
      for (size_t i = 0; i < sources.size(); ++i) same += predicted[i] == expected.tokens[i];
      if (dist::world().rank() == 0)
        std::cout << "  [beam 3] " << type << (fsdp ? " with FSDP" : "") << ": " << same << "/" << sources.size()
                  << " sources give one process's ids\n";
      EXPECT_EQ(same, int(sources.size()));
    }
  }
}

}  // namespace
}  // namespace mt::testing
