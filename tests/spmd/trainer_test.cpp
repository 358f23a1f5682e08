// The Trainer end to end on real text: a small GPT over the bytes of Tiny Shakespeare.
// The loss falls; the same fit on a data x model mesh gives the same losses; a run stopped
// and resumed from its checkpoint reproduces the uninterrupted run's losses step for step;
// metrics.jsonl and TensorBoard events are written.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "meshtrain/data/documents.h"
#include "meshtrain/data/lm_dataset.h"
#include "meshtrain/distributed/layout_tree.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/io/json.h"
#include "meshtrain/train/profiler.h"
#include "meshtrain/train/tensorboard_reader.h"
#include "meshtrain/train/trainer.h"
#include "tests/support/op_check.h"
#include "tests/support/shakespeare_lm.h"
#include "tests/support/tiny_gpt.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;

TinyGptConfig config() {
  TinyGptConfig c;
  c.vocab = 256;  // bytes
  c.width = 32;
  c.heads = 4;
  c.layers = 2;
  c.time = 32;
  c.batch = 8;  // per step, over all ranks
  return c;
}

// A fifth of the play is plenty for these runs.
std::shared_ptr<const data::Dataset> shakespeare(int64_t seq_len, size_t text_bytes = 200000) {
  return shakespeare_bytes(seq_len, text_bytes);
}

train::CollateFn collate() { return next_token_batch; }

struct FitRun {
  std::vector<double> losses;
  double eval_loss = 0;
  std::vector<train::EpochSummary> epochs;
};

// epochs > 1 trains on the first text_bytes of the play only, so that epochs are short.
FitRun fit(const std::string& mesh, const std::string& workdir, int64_t max_steps, bool resume, int64_t save_every = 0,
           int64_t epochs = 1, size_t text_bytes = 200000) {
  const TinyGptConfig c = config();
  train::Deployer deployer({.seed = 3, .mesh = mesh, .workdir = workdir, .verbose = false});
  Params host = tiny_gpt_init(c, "single", nullptr);
  train::ShardingPlan plan = deployer.sharding_rules(host, tiny_gpt_roles(c));
  TinyGptConfig local = c;
  train::Trainer trainer(
      deployer, collate(),
      [local](const Params& p, const train::Batch& b, const RngKey& key) {
        TinyGptConfig sized = local;  // eval's last batch is smaller: the tiny GPT reshapes by it
        sized.batch = b["ids"].dim(0);
        return tiny_gpt_loss(sized, p, b["ids"], b["labels"], key.stream);
      },
      host, optim::adamw(optim::warmup_cosine_decay_schedule(0.0, 3e-3, 10, 200), 0.9, 0.99, 1e-5, 0.01), plan);
  train::FitOptions o;
  o.per_device_batch_size = c.batch / deployer.data_size();
  o.max_steps = max_steps;
  o.epochs = epochs;
  o.save_every = save_every;
  o.resume = resume;
  o.eval_data = shakespeare(c.time, text_bytes);
  o.eval_every = 1000000;  // only the explicit eval below
  o.eval_at_end = false;
  auto data = shakespeare(c.time, text_bytes);
  train::FitResult r = trainer.fit(data, o);
  FitRun run{r.losses, 0, r.epochs};
  std::shared_ptr<const data::Dataset> eval = o.eval_data;
  run.eval_loss = trainer.eval_loss(eval, o.per_device_batch_size);
  return run;
}

std::string workdir(const std::string& name) {
  std::string dir = (fs::temp_directory_path() / ("mt_trainer_" + name + "_np" + std::to_string(dist::world().size()))).string();
  if (dist::world().rank() == 0) fs::remove_all(dir);
  dist::world().barrier();
  return dir;
}

TEST(Trainer, LossFallsAndMeshesAgree) {
  const int n = dist::world().size();
  const std::string one = "data=1";
  FitRun single = fit(n == 1 ? one : "data=" + std::to_string(n), workdir("a"), 60, false);
  ASSERT_EQ(single.losses.size(), 60u);
  double first = single.losses.front(), last = 0;
  for (size_t i = 50; i < 60; ++i) last += single.losses[i] / 10;
  if (dist::world().rank() == 0) std::cout << "  loss " << first << " -> " << last << " (ln 256 = 5.545)\n";
  EXPECT_LT(last, first - 1.5);
  if (n == 4) {
    FitRun grid = fit("data=2,model=2", workdir("b"), 60, false);
    double err = 0;
    for (size_t i = 0; i < 60; ++i) err = std::max(err, std::abs(grid.losses[i] - single.losses[i]));
    if (dist::world().rank() == 0) std::cout << "  [max err] losses data=2,model=2 vs data=4: " << err << "\n";
    EXPECT_LE(err, 1e-4);
  }
}

// f16 with dynamic loss scaling on several processes: the overflow check is the global norm of
// the gradients, reduced and laid out, so every rank skips the same steps (none waits on a
// collective another skipped) and ends with the same scale, on data parallel and on
// data=2,model=2 (sharded weights); the losses stay finite and the run reaches its last step.
TEST(Trainer, F16LossScalingSkipsTheSameStepsOnEveryRank) {
  const int n = dist::world().size();
  std::vector<std::string> meshes = {"data=" + std::to_string(n)};
  if (n == 4) meshes.push_back("data=2,model=2");
  for (const std::string& mesh : meshes) {
    PrecisionScope f16(precision_policy_from_name("f16"));
    const TinyGptConfig c = config();
    train::Deployer deployer({.seed = 3, .mesh = mesh, .workdir = workdir("f16"), .verbose = false});
    Params host = tiny_gpt_init(c, "single", nullptr);
    train::ShardingPlan plan = deployer.sharding_rules(host, tiny_gpt_roles(c));
    train::Trainer trainer(
        deployer, collate(),
        [c](const Params& p, const train::Batch& b, const RngKey& key) {
          return tiny_gpt_loss(c, p, b["ids"], b["labels"], key.stream);
        },
        host, optim::adamw(optim::constant_schedule(3e-3)), plan);
    train::FitOptions o;
    o.per_device_batch_size = c.batch / deployer.data_size();
    o.max_steps = 16;
    o.progress = false;
    o.loss_scale = {.init_scale = 0x1p26, .growth_interval = 1000};
    const train::FitResult r = trainer.fit(shakespeare(c.time), o);
    ASSERT_EQ(r.losses.size(), 16u) << mesh;
    for (double l : r.losses) EXPECT_TRUE(std::isfinite(l)) << mesh;
    const optim::LossScaler* s = trainer.loss_scaler();
    ASSERT_NE(s, nullptr);
    const int64_t mine[2] = {s->skipped_steps(), int64_t(std::log2(s->scale()))};
    std::vector<int64_t> all(size_t(2 * n));
    dist::world().all_gather(mine, all.data(), 2, DType::i64);
    for (int rank = 0; rank < n; ++rank) {
      EXPECT_EQ(all[size_t(2 * rank)], mine[0]) << mesh << ": rank " << rank << " skipped other steps";
      EXPECT_EQ(all[size_t(2 * rank + 1)], mine[1]) << mesh << ": rank " << rank << " has another scale";
    }
    EXPECT_GE(mine[0], 2) << mesh << ": 2^26 must overflow f16's gradients";
    EXPECT_LT(mine[0], 16) << mesh;
    if (dist::world().rank() == 0)
      std::cout << "  " << mesh << ": " << mine[0] << " of 16 f16 steps skipped from 2^26 on every rank, scale 2^"
                << mine[1] << "\n";
  }
}

// Every held-out row counts: 7 rows with a per-device batch of 2 (a global batch of 2n), on 1, 2
// or 4 processes and on data=2,model=2, give the mean over the 7 rows' own losses (each row
// alone, on one device). The rows after the last whole global batch run replicated.
TEST(Trainer, EvalLossCoversEveryRowOnAnyNumberOfProcesses) {
  const int n = dist::world().size();
  TinyGptConfig c = config();
  c.dropout = 0;  // this loss function drops out even in evaluation
  auto rows = std::make_shared<data::SubsetDataset>(shakespeare(c.time), 0, 7);
  const Params host = tiny_gpt_init(c, "single", nullptr);
  double expected = 0;
  for (int64_t i = 0; i < rows->size(); ++i) {
    const train::Batch b = collate()({rows->get(i)});
    TinyGptConfig one = c;
    one.batch = 1;
    expected += tiny_gpt_loss(one, host, b["ids"], b["labels"], 0).item() / double(rows->size());
  }
  std::vector<std::string> meshes = {"data=" + std::to_string(n)};
  if (n == 4) meshes.push_back("data=2,model=2");
  for (const std::string& mesh : meshes) {
    train::Deployer deployer({.seed = 3, .mesh = mesh, .verbose = false});
    train::ShardingPlan plan = deployer.sharding_rules(host, tiny_gpt_roles(c));
    train::Trainer trainer(
        deployer, collate(),
        [c](const Params& p, const train::Batch& b, const RngKey& key) {
          TinyGptConfig sized = c;  // the tiny GPT reshapes by its batch size: this batch's
          sized.batch = b["ids"].dim(0);
          return tiny_gpt_loss(sized, p, b["ids"], b["labels"], key.stream);
        },
        host, optim::adamw(optim::constant_schedule(1e-3)), plan);
    const double got = trainer.eval_loss(rows, 2);
    if (dist::world().rank() == 0)
      std::cout << "  [max err] eval loss over 7 rows on " << mesh << " (global batch " << 2 * deployer.data_size()
                << ") vs each row alone: " << std::abs(got - expected) << " (" << got << ")\n";
    EXPECT_NEAR(got, expected, 2e-5) << mesh;
  }
}

TEST(Trainer, ResumeReproducesTheUninterruptedRun) {
  const int n = dist::world().size();
  const std::string mesh = "data=" + std::to_string(n);
  FitRun whole = fit(mesh, workdir("whole"), 30, false);
  const std::string dir = workdir("resumed");
  FitRun part1 = fit(mesh, dir, 12, false, 6);
  FitRun part2 = fit(mesh, dir, 30, true);
  ASSERT_EQ(part1.losses.size() + part2.losses.size(), whole.losses.size());
  std::vector<double> joined = part1.losses;
  joined.insert(joined.end(), part2.losses.begin(), part2.losses.end());
  double err = 0;
  for (size_t i = 0; i < joined.size(); ++i) err = std::max(err, std::abs(joined[i] - whole.losses[i]));
  if (dist::world().rank() == 0) std::cout << "  [max err] resumed vs uninterrupted losses: " << err << "\n";
  EXPECT_EQ(err, 0.0);
  // Logs: one train record per step in metrics.jsonl (the resumed run appended), events parse.
  if (dist::world().rank() == 0) {
    std::ifstream jl(dir + "/metrics.jsonl");
    int lines = 0;
    for (std::string line; std::getline(jl, line);) {
      if (line.find("\"train\"") == std::string::npos) continue;
      ++lines;
      // Every step says where the memory is: resident now and at the peak (rank 0's, GB).
      const nlohmann::json j = nlohmann::json::parse(line);
      EXPECT_GT(j.value("rss_gb", 0.0), 0.01) << line;
      EXPECT_GE(j.value("peak_rss_gb", 0.0), j.value("rss_gb", 1e9)) << line;
    }
    EXPECT_EQ(lines, 30);
    int scalars = 0;
    for (const auto& e : fs::directory_iterator(dir + "/tensorboard"))
      for (const auto& ev : train::read_tensorboard_events(e.path().string())) scalars += int(ev.scalars.size());
    EXPECT_GE(scalars, 30);
  }
}

// The train loss of an epoch interrupted mid-way covers its steps before the interruption
// too (checkpoints carry the epoch's running sum): the resumed run prints the same epoch
// lines as the uninterrupted one.
TEST(Trainer, EpochLossAfterAMidEpochResumeCoversTheWholeEpoch) {
  const int n = dist::world().size();
  const std::string mesh = "data=" + std::to_string(n);
  const size_t bytes = 3000;  // 90 sequences of 33 bytes: 11 steps of 8 per epoch
  FitRun whole = fit(mesh, workdir("epochs_whole"), -1, false, 0, 3, bytes);
  ASSERT_EQ(whole.epochs.size(), 3u);
  ASSERT_EQ(whole.epochs[0].step, 11);
  const std::string dir = workdir("epochs_resumed");
  FitRun part1 = fit(mesh, dir, 16, false, 0, 3, bytes);  // stops 5 steps into epoch 2
  FitRun part2 = fit(mesh, dir, -1, true, 0, 3, bytes);
  ASSERT_EQ(part1.epochs.size(), 1u);
  ASSERT_EQ(part2.epochs.size(), 2u);
  ASSERT_EQ(part2.losses.size(), 17u);
  double err = std::abs(part1.epochs[0].train_loss - whole.epochs[0].train_loss);
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_EQ(part2.epochs[e].epoch, whole.epochs[e + 1].epoch);
    err = std::max(err, std::abs(part2.epochs[e].train_loss - whole.epochs[e + 1].train_loss));
  }
  if (dist::world().rank() == 0)
    std::cout << "  [max err] epoch train losses, resumed mid-epoch vs uninterrupted: " << err << " (epoch 2: "
              << part2.epochs[0].train_loss << ", its resumed steps alone: "
              << [&] {
                   double s = 0;
                   for (size_t i = 0; i < 6; ++i) s += part2.losses[i];
                   return s / 6;
                 }()
              << ")\n";
  EXPECT_EQ(err, 0.0);
}

// A custom train step (here plain SGD written by hand over micro-batches) replaces the
// default one: it sees the step's micro-batches and key and its updates are what fit trains.
// It must equal the default step with optim::sgd, and the training flag must reach the loss.
// Optimizer slots are restored in the layout of their own parameter, read from the live state,
// even when a slot's path ends with another parameter's path ("1.mu.w" vs the parameter
// "mu.w"): the old suffix match took mu.w's replicated layout for w's split slot.
TEST(Trainer, RestoredOptimizerSlotsKeepTheirParametersLayouts) {
  const int n = dist::world().size();
  const std::string dir = workdir("slots");
  Params host{{"w", random_normal({8 * n, 4}, 31)}, {"mu.w", random_normal({4}, 32)}};
  auto run = [&](int64_t steps, bool resume) {
    train::Deployer deployer({.seed = 2, .mesh = "model=" + std::to_string(n), .workdir = dir, .verbose = false});
    train::ShardingOptions so;
    so.overrides = {{"w", dist::PartitionSpec{"model", ""}}, {"mu\\.w", dist::PartitionSpec{}}};
    train::ShardingPlan plan = deployer.sharding_rules(host, {}, so);
    auto loss = [](const Params& p, const train::Batch&, const RngKey&) {
      return add(sum(square(p["w"])), sum(square(p["mu.w"])));
    };
    train::Trainer trainer(deployer, collate(), loss, host,
                           optim::chain({optim::clip_by_global_norm(1.0), optim::adam(optim::constant_schedule(0.1))}),
                           plan);
    const dist::LayoutTree fresh = dist::layout_tree(trainer.opt_state());
    train::FitOptions o;
    o.per_device_batch_size = 2;
    o.max_steps = steps;
    o.resume = resume;
    o.progress = false;
    o.eval_at_end = false;
    trainer.fit(shakespeare(8, 20000), o);
    EXPECT_EQ(dist::layout_tree(trainer.opt_state()), fresh);
    return trainer.opt_state();
  };
  run(2, false);
  Params resumed = run(3, true);
  if (n > 1) {
    EXPECT_EQ(dist::sharding_of(resumed["1.mu.w"])->spec, (dist::PartitionSpec{"model", ""}));
  }
}

TEST(Trainer, CustomTrainStepReplacesTheDefault) {
  const TinyGptConfig c = config();
  const int n = dist::world().size();
  auto run = [&](bool custom, const std::string& dir) {
    train::Deployer deployer({.seed = 5, .mesh = "data=" + std::to_string(n), .workdir = dir, .verbose = false});
    Params host = tiny_gpt_init(c, "single", nullptr);
    int training_calls = 0, eval_calls = 0;
    auto loss = [&, c](const Params& p, const train::Batch& b, const RngKey& key, bool training) {
      (training ? training_calls : eval_calls) += 1;
      return tiny_gpt_loss(c, p, b["ids"], b["labels"], key.stream);
    };
    train::Trainer trainer(deployer, collate(), loss, host, optim::sgd(optim::constant_schedule(0.5)),
                           deployer.sharding_rules(host, tiny_gpt_roles(c)));
    int custom_steps = 0;
    if (custom)
      trainer.set_train_step([&](Params& params, Params&, const std::vector<train::Batch>& micro, const RngKey& key) {
        ++custom_steps;
        Params sum;
        double total = 0;
        for (size_t m = 0; m < micro.size(); ++m) {
          auto [l, g] = value_and_grad([&](const Params& p) { return loss(p, micro[m], key.fold_in(m), true); })(params);
          total += dist::to_host(l).item();
          for (const auto& [path, grad] : g) sum.set(path, sum.contains(path) ? add(sum[path], grad) : grad);
        }
        for (auto& [path, value] : params) value = sub(value, mul(sum[path], 0.5 / double(micro.size())));
        return total / double(micro.size());
      });
    train::FitOptions o;
    o.per_device_batch_size = c.batch / deployer.data_size();
    o.grad_accum_steps = 2;
    o.max_steps = 8;
    o.eval_data = std::make_shared<data::SubsetDataset>(shakespeare(c.time), 0, 64);
    o.eval_every = 4;
    o.save_last = false;
    o.progress = false;
    train::FitResult r = trainer.fit(shakespeare(c.time), o);
    EXPECT_EQ(custom_steps, custom ? 8 : 0);
    EXPECT_EQ(training_calls, 16);  // 8 steps x 2 micro-batches
    EXPECT_GT(eval_calls, 0);
    return r.losses;
  };
  std::vector<double> reference = run(false, workdir("sgd")), hooked = run(true, workdir("custom"));
  ASSERT_EQ(hooked.size(), 8u);
  double err = 0;
  for (size_t i = 0; i < 8; ++i) err = std::max(err, std::abs(hooked[i] - reference[i]));
  if (dist::world().rank() == 0) std::cout << "  [max err] custom SGD step vs optim::sgd: " << err << "\n";
  EXPECT_LE(err, 1e-6);
}

// A collate that pads to its own slice's length gives the ranks batches of different widths;
// the step would issue mismatched collectives. Every rank stops at the first step instead, with
// an error naming the field and its shape, and a single process is unaffected.
TEST(Trainer, RanksWhoseBatchesDifferInShapeStopWithTheShapes) {
  const TinyGptConfig c = config();
  const int n = dist::world().size();
  train::Deployer deployer({.seed = 5, .mesh = "data=" + std::to_string(n), .workdir = workdir("ragged"), .verbose = false});
  Params host = tiny_gpt_init(c, "single", nullptr);
  train::CollateFn ragged = [&](const std::vector<data::Example>& rows) {
    train::Batch b = next_token_batch(rows);
    // Rank r keeps c.time - r positions: what padding "to the longest row of this slice" does.
    const int64_t t = c.time - deployer.data_index();
    b.set("ids", slice(b["ids"], 1, 0, t));
    b.set("labels", slice(b["labels"], 1, 0, t));
    return b;
  };
  train::Trainer trainer(deployer, ragged,
                         [c](const Params& p, const train::Batch& b, const RngKey& key) {
                           TinyGptConfig sized = c;
                           sized.batch = b["ids"].dim(0), sized.time = b["ids"].dim(1);
                           return tiny_gpt_loss(sized, p, b["ids"], b["labels"], key.stream);
                         },
                         host, optim::sgd(optim::constant_schedule(0.1)), deployer.sharding_rules(host, tiny_gpt_roles(c)));
  train::FitOptions o;
  o.per_device_batch_size = c.batch / deployer.data_size();
  o.max_steps = 2;
  o.save_last = false;
  o.progress = false;
  if (n == 1) {
    EXPECT_EQ(trainer.fit(shakespeare(c.time), o).losses.size(), 2u);
    return;
  }
  try {
    trainer.fit(shakespeare(c.time), o);
    ADD_FAILURE() << "ranks with batches of different shapes trained";
  } catch (const Error& e) {
    const std::string want = "rank " + std::to_string(dist::world().rank()) + " collated {ids (" +
                             std::to_string(o.per_device_batch_size) + ", " + std::to_string(c.time - deployer.data_index());
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pad to a fixed length"), std::string::npos) << e.what();
    if (dist::world().rank() == 0) std::cout << "  " << e.what() << "\n";
  }
  EXPECT_EQ(trainer.step(), 0);
}

}  // namespace
}  // namespace mt::testing

namespace mt::testing {
namespace {

using nlohmann::json;

struct Span {
  std::string name, cat;
  double ts, end;
  int pid, tid;
  json args;
};

std::vector<Span> spans_of(const json& trace) {
  std::vector<Span> out;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "X")
      out.push_back({e["name"], e["cat"], e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>(),
                     e["pid"], e["tid"], e.value("args", json::object())});
  return out;
}

// --profile on a data-parallel run: the merged trace parses, its spans nest on every thread,
// the spans inside each step cover it, every recorded forward op has its VJP span, every rank
// has its tracks and the same collectives, and ops.json adds up to the trace.
TEST(Profiler, TraceNestsCoversStepsAndMatchesTheOpTable) {
  const int n = dist::world().size();
  const TinyGptConfig c = config();
  const std::string dir = workdir("profile");
  train::Deployer deployer({.seed = 4, .mesh = "data=" + std::to_string(n), .workdir = dir, .verbose = false});
  Params host = tiny_gpt_init(c, "single", nullptr);
  train::Trainer trainer(
      deployer, collate(),
      [c](const Params& p, const train::Batch& b, const RngKey& key) {
        return tiny_gpt_loss(c, p, b["ids"], b["labels"], key.stream);
      },
      host, optim::adamw(optim::constant_schedule(1e-3)), deployer.sharding_rules(host, tiny_gpt_roles(c)));
  train::FitOptions o;
  o.per_device_batch_size = c.batch / deployer.data_size();
  o.max_steps = 5;
  o.profile_steps = "2:3";
  o.eval_at_end = false;
  trainer.fit(shakespeare(c.time, 20000), o);
  dist::world().barrier();

  const json trace = io::read_json_file(dir + "/profile/trace.json");
  const std::vector<Span> spans = spans_of(trace);
  ASSERT_FALSE(spans.empty());
  const double eps = 1.0;  // µs: spans are timed at their ends, a little apart
  // Nesting: on each (pid, tid) track, sorted by start, a span lies inside or after the open ones.
  std::map<std::pair<int, int>, std::vector<const Span*>> tracks;
  for (const Span& s : spans) tracks[{s.pid, s.tid}].push_back(&s);
  int overlaps = 0;
  for (auto& [track, list] : tracks) {
    std::sort(list.begin(), list.end(), [](const Span* a, const Span* b) {
      return a->ts < b->ts || (a->ts == b->ts && a->end > b->end);
    });
    std::vector<const Span*> open;
    for (const Span* s : list) {
      while (!open.empty() && s->ts >= open.back()->end - eps) open.pop_back();
      if (!open.empty() && s->end > open.back()->end + eps) {
        if (++overlaps <= 3)
          ADD_FAILURE() << s->name << " [" << s->ts << ", " << s->end << "] overlaps " << open.back()->name << " ["
                        << open.back()->ts << ", " << open.back()->end << "] on pid " << track.first << " tid "
                        << track.second;
      }
      open.push_back(s);
    }
  }
  EXPECT_EQ(overlaps, 0);
  // Coverage: the spans directly inside the steps cover >= 90 % of them on average, and each
  // step >= 60 % (with 4 ranks and another test on 2 cores, a rank descheduled between two
  // spans left one 9-14 ms step at 88 % once and at 73.6 % once, in a full ctest -j2 run,
  // against 99.9 % alone; a phase without its span would lower every step, and the mean).
  int steps = 0;
  double share_sum = 0;
  for (const Span& step : spans) {
    if (step.cat != "step") continue;
    ++steps;
    std::vector<const Span*> inside;
    for (const Span& s : spans)
      if (&s != &step && s.pid == step.pid && s.tid == step.tid && s.ts >= step.ts - eps && s.end <= step.end + eps)
        inside.push_back(&s);
    std::sort(inside.begin(), inside.end(), [](const Span* a, const Span* b) { return a->ts < b->ts; });
    double covered = 0, reach = step.ts;
    for (const Span* s : inside) {
      if (s->end <= reach) continue;  // nested in one already counted
      covered += s->end - std::max(s->ts, reach);
      reach = s->end;
    }
    const double share = covered / (step.end - step.ts);
    if (step.pid == 0 && dist::world().rank() == 0) std::cout << "  " << step.name << ": spans cover " << 100 * share << "% of " << (step.end - step.ts) / 1000 << " ms\n";
    EXPECT_GE(share, 0.6) << step.name << " on rank " << step.pid;
    share_sum += share;
  }
  EXPECT_EQ(steps, 2 * n);
  EXPECT_GE(share_sum / std::max(steps, 1), 0.9) << "the steps' mean share covered by their spans";
  // Every recorded forward op has a VJP span of the same name; every rank has its process.
  std::set<std::string> recorded, vjps;
  std::map<int, int> collectives;
  std::set<int> pids;
  for (const Span& s : spans) {
    pids.insert(s.pid);
    if (s.cat == "op" && s.args.value("recorded", 0.0) == 1.0) recorded.insert(s.name);
    if (s.cat == "vjp") vjps.insert(s.name);
    if (s.cat == "collective") ++collectives[s.pid];
  }
  EXPECT_FALSE(recorded.empty());
  for (const std::string& op : recorded) EXPECT_TRUE(vjps.count(op)) << "no VJP span for recorded op " << op;
  EXPECT_EQ(int(pids.size()), n);
  if (n > 1) {
    // Collectives name their kind, size, axis and whether the caller blocked on them;
    // ops on global arrays carry their layouts around the kernel.
    int tagged = 0, spmd = 0, all_collectives = 0;
    for (const Span& s : spans) {
      all_collectives += s.cat == "collective";
      const std::string what = s.args.value("what", std::string());
      if (s.cat == "collective" && (what.find("[sync]") != std::string::npos || what.find("[async]") != std::string::npos))
        ++tagged;
      if (s.cat == "spmd" && s.args.contains("output") && s.args.contains("mesh")) ++spmd;
    }
    EXPECT_EQ(tagged, all_collectives);
    EXPECT_GT(spmd, 0);
    EXPECT_GT(collectives[0], 0);
    for (int r = 1; r < n; ++r) EXPECT_EQ(collectives[r], collectives[0]) << "rank " << r;
  }
  // ops.json: rank 0's totals by (phase, op) equal the trace's sums.
  const json ops = io::read_json_file(dir + "/profile/ops.json");
  std::map<std::pair<std::string, std::string>, double> sums;
  for (const Span& s : spans) {
    if (s.pid != 0) continue;
    const std::string phase = s.cat == "op" ? "forward" : s.cat == "op_backward" ? "backward" : s.cat == "collective" ? "collective" : "";
    if (!phase.empty()) sums[{phase, s.name}] += (s.end - s.ts) / 1000;
  }
  // Rows are per (phase, op, output dtype); their totals per (phase, op) are the trace's.
  std::map<std::pair<std::string, std::string>, double> row_sums;
  for (const json& r : ops["rows"]) {
    const std::string name = r["name"];
    if (name.size() > 11 && name.substr(name.size() - 11) == " (vjp self)") continue;  // VJP spans minus their ops
    EXPECT_TRUE(r.contains("dtype")) << r.dump();
    if (r["phase"] != "collective") {
      EXPECT_FALSE(r["dtype"].get<std::string>().empty()) << r.dump();
    }
    row_sums[{r["phase"], name}] += r["total_ms"].get<double>();
  }
  double worst = 0;
  for (const auto& [key, ms] : row_sums) worst = std::max(worst, std::abs(ms - sums[key]));
  EXPECT_EQ(row_sums.size(), sums.size());
  if (dist::world().rank() == 0) std::cout << "  [max err] ops.json totals vs trace sums: " << worst << " ms\n";
  EXPECT_LE(worst, 1e-6);
  // The breakdown's GEMM and attention shares are their rows' (attention's backward kernels
  // run in its VJP's own time): the fused flash_attention counts as attention, not elementwise.
  double gemm_ms = 0, attention_ms = 0;
  for (const json& r : ops["rows"]) {
    const std::string name = r["name"];
    if (name == "matmul") gemm_ms += r["total_ms"].get<double>();
    for (const char* a : {"flash_attention", "causal_softmax", "softmax"})
      if (name == a || name == std::string(a) + " (vjp self)") attention_ms += r["total_ms"].get<double>();
  }
  const double step_ms = ops["step_ms"];
  EXPECT_GT(attention_ms, 0.0);
  EXPECT_NEAR(ops["breakdown"]["attention"].get<double>(), 100 * attention_ms / step_ms, 1e-6);
  EXPECT_NEAR(ops["breakdown"]["gemm"].get<double>(), 100 * gemm_ms / step_ms, 1e-6);
}

TEST(Profiler, BadRangesAreErrorsBeforeTraining) {
  expect_error([] { train::ProfileRange::parse("5:3"); }, {"'5:3' ends before it starts"});
  expect_error([] { train::ProfileRange::parse("x"); }, {"START:END", "'x'"});
  expect_error([] { train::ProfileRange::parse("0:2"); }, {"numbered from 1"});
  const TinyGptConfig c = config();
  train::Deployer deployer({.seed = 4, .mesh = "data=" + std::to_string(dist::world().size()), .workdir = workdir("profile_bad"), .verbose = false});
  Params host = tiny_gpt_init(c, "single", nullptr);
  train::Trainer trainer(
      deployer, collate(),
      [c](const Params& p, const train::Batch& b, const RngKey& key) { return tiny_gpt_loss(c, p, b["ids"], b["labels"], key.stream); },
      host, optim::sgd(optim::constant_schedule(0.1)));
  train::FitOptions o;
  o.per_device_batch_size = c.batch / deployer.data_size();
  o.max_steps = 4;
  o.profile_steps = "3:9";
  o.progress = false;
  expect_error([&] { trainer.fit(shakespeare(c.time, 20000), o); }, {"steps 3:9 are outside this run", "1 to 4"});
  EXPECT_EQ(trainer.step(), 0);
}

}  // namespace
}  // namespace mt::testing
