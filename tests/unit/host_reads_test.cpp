// Host reads inside a training step (issue 45): on a GPU each read of array values to the host
// waits for the stream, so the forward and backward of a step must not read any. The CPU build
// counts the same reads (host_read_count), so this test keeps them at 0 wherever it runs:
// GPT-2 (with and without a padding mask, whose positions are counted on the device), LLaMA
// (rotary positions) and the BERT classifier (padding mask, ignored labels) read nothing
// between the batch and the loss; an out-of-range label is still an error naming its
// position; and a whole Trainer step — forward, backward, gradient clipping, AdamW — reads
// nothing between its batch and its loss read, as metrics.jsonl's host_reads says; an
// evaluation reads its loss once at the end, whatever its number of batches.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "meshtrain/core/device_constants.h"
#include "meshtrain/core/host_reads.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/models/bert.h"
#include "meshtrain/models/decoder_inputs.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/models/llama.h"
#include "meshtrain/models/t5.h"
#include "tests/support/model_twins.h"
#include "tests/support/next_token_batches.h"

namespace mt::testing {
namespace {

using namespace mt::models;

// Reads made by value_and_grad of `loss` (the step's forward and backward), and the loss.
std::pair<uint64_t, Array> reads_of(const std::function<Array(const Params&)>& loss, const Params& p) {
  const uint64_t before = host_read_count();
  auto [value, grads] = value_and_grad(loss)(p);
  return {host_read_count() - before, value};
}

TEST(HostReads, Gpt2StepReadsNothingBeforeItsLoss) {
  Gpt2Config c;
  c.vocab_size = 41, c.n_positions = 32, c.n_embd = 24, c.n_layer = 2, c.n_head = 4;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.1;
  Params p = random_model_params(gpt2_param_defs(c), 1);
  Array ids = random_ints({2, 16}, 2, 0, c.vocab_size);
  std::vector<int64_t> l = random_ints({2, 16}, 3, 0, c.vocab_size).to_ints();
  l[3] = l[17] = -100;  // ignored targets
  Array labels = Array::from_vector(l, {2, 16});
  auto [reads, loss] = reads_of([&](const Params& q) {
    return cross_entropy(gpt2_apply(c, q, {.input_ids = ids}, RngKey{1, 0}, true), labels);
  }, p);
  EXPECT_EQ(reads, 0u);
  EXPECT_TRUE(std::isfinite(loss.item()));
}

// Positions from a padding mask (transformers': cumsum(mask) - 1, masked positions 1) are made
// on the device: equal to the host's count on left and right padding, an empty row, a mask
// longer than the new positions (a cache's), and a GPT-2 step with padding reads nothing.
TEST(HostReads, PositionsFromAPaddingMaskAreCountedOnTheDevice) {
  const std::vector<int64_t> m = {0, 0, 1, 1, 1, 1, 1,   // left padding
                                  1, 1, 1, 1, 0, 0, 0,   // right padding
                                  0, 0, 0, 0, 0, 0, 0,   // nothing attended
                                  1, 0, 1, 1, 0, 1, 1};  // holes
  const Array mask = Array::from_vector(m, {4, 7});
  for (int64_t t : {7, 3, 1}) {
    std::vector<int64_t> want;
    for (int64_t i = 0; i < 4; ++i) {
      int64_t count = 0;
      for (int64_t j = 0; j < 7; ++j) {
        count += m[size_t(i * 7 + j)];
        if (j >= 7 - t) want.push_back(m[size_t(i * 7 + j)] ? count - 1 : 1);
      }
    }
    const uint64_t before = host_read_count();
    const Array pos = position_ids_from_mask(mask, t);
    EXPECT_EQ(host_read_count(), before) << "t " << t;
    EXPECT_EQ(pos.shape(), Shape({4, t}));
    EXPECT_EQ(pos.dtype(), DType::i64);
    EXPECT_EQ(pos.to_ints(), want) << "t " << t;
  }
  std::vector<int64_t> long_mask(3 * 300, 1);
  for (int64_t j = 0; j < 41; ++j) long_mask[size_t(300 + j)] = 0;  // row 1 left-padded by 41
  const std::vector<int64_t> pos = position_ids_from_mask(Array::from_vector(long_mask, {3, 300}), 300).to_ints();
  EXPECT_EQ(pos[299], 299);
  EXPECT_EQ(pos[300 + 40], 1);
  EXPECT_EQ(pos[300 + 299], 299 - 41);

  Gpt2Config c;
  c.vocab_size = 41, c.n_positions = 32, c.n_embd = 24, c.n_layer = 2, c.n_head = 4;
  Params p = random_model_params(gpt2_param_defs(c), 1);
  const Array ids = random_ints({4, 7}, 2, 0, c.vocab_size), labels = random_ints({4, 7}, 3, 0, c.vocab_size);
  auto [reads, loss] = reads_of([&](const Params& q) {
    return cross_entropy(gpt2_apply(c, q, {.input_ids = ids, .attention_mask = mask}, RngKey{1, 0}, true), labels);
  }, p);
  EXPECT_EQ(reads, 0u);
  EXPECT_TRUE(std::isfinite(loss.item()));
}

TEST(HostReads, BertClassifierWithPaddingReadsNothingBeforeItsLoss) {
  BertConfig c;
  c.vocab_size = 37, c.hidden_size = 24, c.num_hidden_layers = 2, c.num_attention_heads = 4;
  c.intermediate_size = 48, c.max_position_embeddings = 32, c.head = BertHead::sequence_classification;
  c.num_labels = 3;
  Params p = random_model_params(bert_param_defs(c), 4);
  std::vector<int64_t> m(4 * 16, 1);
  for (int i = 10; i < 16; ++i) m[size_t(3 * 16 + i)] = 0;
  BertInputs in{.input_ids = random_ints({4, 16}, 5, 0, c.vocab_size), .attention_mask = Array::from_vector(m, {4, 16})};
  Array labels = Array::from_vector(std::vector<int64_t>{0, 2, -100, 1}, {4});
  auto [reads, loss] = reads_of([&](const Params& q) {
    return cross_entropy(bert_apply(c, q, in, RngKey{2, 0}, true).logits, labels);
  }, p);
  EXPECT_EQ(reads, 0u);
  EXPECT_TRUE(std::isfinite(loss.item()));
}

TEST(HostReads, LlamaStepWithRotaryPositionsReadsNothingBeforeItsLoss) {
  LlamaConfig c;
  c.vocab_size = 33, c.hidden_size = 32, c.intermediate_size = 48, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2;
  Params p = random_model_params(llama_param_defs(c), 7);
  Array ids = random_ints({2, 16}, 8, 0, c.vocab_size);
  auto [reads, loss] = reads_of([&](const Params& q) {
    return cross_entropy(llama_apply(c, q, {.input_ids = ids}, RngKey{3, 0}, true), ids);
  }, p);
  EXPECT_EQ(reads, 0u);
  EXPECT_TRUE(std::isfinite(loss.item()));
}

// What a step builds from shapes alone — position ranges, rotary frequencies, T5's relative
// buckets — is made once and found again: a later step of the same shapes makes nothing new
// (on a GPU: uploads nothing but its batch, as a captured step needs).
TEST(HostReads, ShapeOnlyConstantsAreMadeOnceAndReused) {
  LlamaConfig lc;
  lc.vocab_size = 33, lc.hidden_size = 48, lc.intermediate_size = 48, lc.num_hidden_layers = 2;
  lc.num_attention_heads = 4, lc.num_key_value_heads = 2;
  lc.rope_theta = 12345.0;  // shapes and settings no other test here uses: their constants are new
  const Params lp = random_model_params(llama_param_defs(lc), 7);
  BertConfig bc;
  bc.vocab_size = 37, bc.hidden_size = 24, bc.num_hidden_layers = 1, bc.num_attention_heads = 4;
  bc.intermediate_size = 48, bc.max_position_embeddings = 32;
  const Params bp = random_model_params(bert_param_defs(bc), 4);
  T5Config tc;
  const Array table = random_normal({tc.relative_attention_num_buckets, 3}, 9);
  const Array ids = random_ints({2, 11}, 8, 0, 33);
  auto step = [&] {
    cross_entropy(llama_apply(lc, lp, {.input_ids = ids}, RngKey{3, 0}, true), ids);
    bert_apply(bc, bp, {.input_ids = ids}, RngKey{2, 0}, true);
    return t5_position_bias(tc, table, 0, 11, 11, true);
  };
  const size_t at_start = device_constant_stats().entries;
  const Array first = step();
  const size_t made = device_constant_stats().entries;
  EXPECT_GE(made, at_start + 3u) << "positions, rotary frequencies and T5 buckets";
  const Array second = step();
  EXPECT_EQ(device_constant_stats().entries, made);
  EXPECT_EQ(max_abs_diff(first, second), 0.0);
  // A decoding step's one position changes at every call: it is not kept.
  for (int64_t past = 20; past < 25; ++past) EXPECT_EQ(arange_ids(past, 1).to_ints(), std::vector<int64_t>{past});
  t5_position_bias(tc, table, 30, 1, 31, false);
  EXPECT_EQ(device_constant_stats().entries, made);
  // The buckets themselves: one array, found again by the same shape.
  const Array a = device_constant("test buckets", Device::cpu(), [] { return Array::zeros({3}); });
  int calls = 0;
  const Array b = device_constant("test buckets", Device::cpu(), [&] { ++calls; return Array::ones({3}); });
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(a.shares_storage(b));
}

TEST(HostReads, CrossEntropyStillNamesAnOutOfRangeLabel) {
  Array logits = random_normal({3, 5}, 6);
  Array labels = Array::from_vector(std::vector<int64_t>{1, -100, 7}, {3});
  try {
    cross_entropy(logits, labels);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 7 out of range for 5 classes at flat position 2"), std::string::npos)
        << e.what();
  }
  // Every target ignored: the mean is NaN (as PyTorch), its gradient 0.
  Array none = Array::from_vector(std::vector<int64_t>{-100, -100, -100}, {3});
  auto [value, grads] = value_and_grad([&](const Params& q) { return cross_entropy(q["x"], none); })(Params{{"x", logits}});
  EXPECT_TRUE(std::isnan(value.item()));
  for (float g : grads["x"].to_floats()) EXPECT_EQ(g, 0.0f);
}


TEST(HostReads, TrainerStepWithClippingAndAdamWReadsNothingBeforeItsLoss) {
  Gpt2Config c;
  c.vocab_size = 41, c.n_positions = 32, c.n_embd = 24, c.n_layer = 2, c.n_head = 4;
  Params p = random_model_params(gpt2_param_defs(c), 4);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("mt_host_reads_" + std::to_string(getpid()));
  train::Deployer deployer({.seed = 1, .workdir = dir.string(), .verbose = false});
  std::vector<data::Example> rows;
  for (int64_t i = 0; i < 8; ++i) rows.push_back({{"tokens", random_ints({17}, 10 + uint64_t(i), 0, c.vocab_size).to_ints()}});
  const auto collate = next_token_collate(16);
  const auto loss = gpt2_next_token_loss(c);
  // A tight clip so that the gradients are scaled, and AdamW: the CLI's optimizer.
  train::Trainer trainer(deployer, collate, loss, p,
                         optim::chain({optim::clip_by_global_norm(0.01), optim::adamw(optim::constant_schedule(1e-3))}));
  train::FitOptions o;
  o.per_device_batch_size = 2, o.grad_accum_steps = 2, o.max_steps = 2;
  trainer.fit(data::make_dataset(rows), o);
  EXPECT_EQ(trainer.last_step_host_reads(), 0u);
  std::ifstream in(dir / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("split", "") != "train") continue;
    ++steps;
    EXPECT_EQ(j["host_reads"].get<double>(), 0.0) << line;
  }
  EXPECT_EQ(steps, 2);
  // optax's MultiSteps accumulating over 2 calls: its micro-step counter is not a read either.
  train::Trainer accumulating(deployer, collate, loss, p, optim::multi_steps(optim::adamw(optim::constant_schedule(1e-3)), 2));
  train::FitOptions o2 = o;
  o2.progress = false;
  accumulating.fit(data::make_dataset(rows), o2);
  EXPECT_EQ(accumulating.last_step_host_reads(), 0u);
  // Evaluation reads its loss once at the end, not once per batch: 7 rows in batches of 2
  // (three whole batches and a tail of one, summed apart) are two reads.
  rows.resize(7);
  const uint64_t before = host_read_count();
  const double eval = trainer.eval_loss(data::make_dataset(rows), 2);
  EXPECT_EQ(host_read_count() - before, 2u);
  EXPECT_TRUE(std::isfinite(eval));
  std::filesystem::remove_all(dir);
}

// After warm-up a training step makes no array from host values (host_upload_count): what it
// builds from shapes is made once (device_constant), and what changes from step to step is
// written into arrays that stay — AdamW's step scalars and the dropout keys' step number, two
// writes per step. So the step's launches and copies are the same every step, as a captured
// CUDA graph replays them. GPT-2 and the BERT classifier with dropout (BERT with padding),
// LLaMA with rotary positions; clipping and AdamW as the CLI's optimizer.
TEST(HostReads, TrainerStepsAfterWarmUpUploadNothingButTheirBatch) {
  // The counters count: an array from host values is an upload, a write into one a write.
  const uint64_t uploads = host_upload_count(), writes = host_write_count();
  const Array made = Array::from_vector(std::vector<int64_t>{3}, {});
  const int64_t four = 4;
  made.write_from_host(&four);
  EXPECT_EQ(host_upload_count(), uploads + 1);
  EXPECT_EQ(host_write_count(), writes + 1);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("mt_host_uploads_" + std::to_string(getpid()));
  train::Deployer deployer({.seed = 1, .workdir = dir.string(), .verbose = false});
  auto run = [&](const char* name, train::CollateFn collate, train::LossFn loss, const Params& p,
                 const std::vector<data::Example>& rows) {
    SCOPED_TRACE(name);
    train::Trainer trainer(deployer, std::move(collate), std::move(loss), p,
                           optim::chain({optim::clip_by_global_norm(1.0), optim::adamw(optim::constant_schedule(1e-3))}));
    train::FitOptions o;
    o.per_device_batch_size = 2, o.max_steps = 4;
    std::vector<uint64_t> writes;
    o.on_step = [&](int64_t, const Params&) { writes.push_back(host_write_count()); };
    trainer.fit(data::make_dataset(rows), o);
    EXPECT_EQ(trainer.last_step_host_uploads(), 0u);
    EXPECT_EQ(trainer.last_step_host_reads(), 0u);
    ASSERT_EQ(writes.size(), 4u);
    for (size_t i = 1; i < writes.size(); ++i) EXPECT_EQ(writes[i] - writes[i - 1], 2u) << "step " << i + 1;
    std::ifstream in(dir / "metrics.jsonl");
    nlohmann::json last;
    for (std::string line; std::getline(in, line);)
      if (nlohmann::json j = nlohmann::json::parse(line); j.value("split", "") == "train" && j.contains("host_reads")) last = j;
    EXPECT_EQ(last["host_uploads"].get<double>(), 0.0) << last.dump();
    std::filesystem::remove_all(dir);
  };
  {
    Gpt2Config c;
    c.vocab_size = 41, c.n_positions = 32, c.n_embd = 24, c.n_layer = 2, c.n_head = 4;
    c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.1;
    std::vector<data::Example> rows;
    for (int64_t i = 0; i < 8; ++i) rows.push_back({{"tokens", random_ints({17}, 30 + uint64_t(i), 0, c.vocab_size).to_ints()}});
    run("gpt2", next_token_collate(16), train::to_loss_fn(gpt2_next_token_loss(c)),
        random_model_params(gpt2_param_defs(c), 4), rows);
  }
  {
    LlamaConfig c;
    c.vocab_size = 33, c.hidden_size = 32, c.intermediate_size = 48, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2;
    std::vector<data::Example> rows;
    for (int64_t i = 0; i < 8; ++i) rows.push_back({{"tokens", random_ints({17}, 40 + uint64_t(i), 0, c.vocab_size).to_ints()}});
    run("llama", next_token_collate(16), [c](const Params& q, const train::Batch& b, const RngKey& k, bool training) {
      return cross_entropy(llama_apply(c, q, {.input_ids = b["ids"]}, k, training), b["labels"]);
    }, random_model_params(llama_param_defs(c), 7), rows);
  }
  {
    BertConfig c;
    c.vocab_size = 37, c.hidden_size = 24, c.num_hidden_layers = 2, c.num_attention_heads = 4;
    c.intermediate_size = 48, c.max_position_embeddings = 32, c.head = BertHead::sequence_classification;
    c.num_labels = 3;
    std::vector<data::Example> rows;
    for (int64_t i = 0; i < 8; ++i)
      rows.push_back({{"tokens", random_ints({16}, 50 + uint64_t(i), 0, c.vocab_size).to_ints()}, {"label", std::vector<int64_t>{i % 3}}});
    auto collate = [](const std::vector<data::Example>& examples) {
      std::vector<int64_t> ids, mask, labels;
      for (size_t r = 0; r < examples.size(); ++r) {
        const std::vector<int64_t>& t = examples[r].tokens("tokens");
        ids.insert(ids.end(), t.begin(), t.end());
        for (int64_t j = 0; j < 16; ++j) mask.push_back(j < 16 - int64_t(r) * 3 ? 1 : 0);  // padded rows
        labels.push_back(examples[r].tokens("label").front());
      }
      const int64_t n = int64_t(examples.size());
      return train::Batch{{"ids", Array::from_vector(ids, {n, 16})}, {"mask", Array::from_vector(mask, {n, 16})},
                          {"labels", Array::from_vector(labels, {n})}};
    };
    run("bert", collate, [c](const Params& q, const train::Batch& b, const RngKey& k, bool training) {
      return cross_entropy(bert_apply(c, q, {.input_ids = b["ids"], .attention_mask = b["mask"]}, k, training).logits,
                           b["labels"]);
    }, random_model_params(bert_param_defs(c), 4), rows);
  }
}

// FitOptions::read_loss_every: the steps' losses are read in one copy every N steps instead of
// after each step (on a GPU the host queues steps back to back). The run is the same: the
// same losses, in order, in metrics.jsonl under the same steps, with a checkpoint and an
// evaluation reading what is pending first; and the loss reads fall from one per step to one
// per N steps (or per event).
TEST(HostReads, LossesReadEveryNStepsInOneCopyLogTheSameRun) {
  Gpt2Config c;
  c.vocab_size = 41, c.n_positions = 32, c.n_embd = 24, c.n_layer = 1, c.n_head = 4;
  const Params p = random_model_params(gpt2_param_defs(c), 4);
  std::vector<data::Example> rows;
  for (int64_t i = 0; i < 20; ++i) rows.push_back({{"tokens", random_ints({9}, 40 + uint64_t(i), 0, c.vocab_size).to_ints()}});
  const auto collate = next_token_collate(8);
  const auto loss = gpt2_next_token_loss(c);
  struct Run {
    std::vector<double> losses;
    std::vector<std::pair<int64_t, double>> logged;  // (step, loss) of each train line
    uint64_t reads;
  };
  auto run = [&](int64_t read_every) {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("mt_read_every_" + std::to_string(getpid()) + "_" + std::to_string(read_every));
    std::filesystem::remove_all(dir);
    train::Deployer deployer({.seed = 3, .workdir = dir.string(), .verbose = false});
    train::Trainer trainer(deployer, collate, loss, p, optim::adamw(optim::constant_schedule(1e-2)));
    train::FitOptions o;
    o.per_device_batch_size = 2, o.epochs = 1, o.save_every = 5, o.shuffle = false;
    o.read_loss_every = read_every;
    const uint64_t before = host_read_count();
    Run r;
    r.losses = trainer.fit(data::make_dataset(rows), o).losses;
    r.reads = host_read_count() - before;
    std::ifstream in(dir / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("split", "") == "train") r.logged.push_back({j["step"].get<int64_t>(), j["loss"].get<double>()});
    }
    std::filesystem::remove_all(dir);
    return r;
  };
  const Run every = run(1), batched = run(4);
  ASSERT_EQ(every.losses.size(), 10u);
  EXPECT_EQ(batched.losses, every.losses);
  EXPECT_EQ(batched.logged, every.logged);
  for (size_t i = 0; i < every.logged.size(); ++i) EXPECT_EQ(every.logged[i].first, int64_t(i) + 1);
  // Ten steps: ten loss reads one by one; read every 4 with a checkpoint at 5 and 10, the
  // reads come after steps 4, 5, 9 and 10.
  EXPECT_EQ(every.reads - batched.reads, 10u - 4u);
}

}  // namespace
}  // namespace mt::testing
