// Deferred index checks (issue 45): inside a DeferredChecks scope (a Trainer step, an
// evaluation) an out-of-range index or label does not stop the host at the op; its verdict is
// recorded on the device and read with the loss, and the error then names the op, the value and
// its flat position as the immediate check does. Meanwhile the kernels read in bounds (the bad
// entries zeroed), so the step finishes without a fault. A Trainer whose step read a bad label
// stops: it neither trains nor checkpoints again, and the checkpoint saved before stays intact.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "meshtrain/autodiff/value_and_grad.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/ops/deferred_checks.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/trainer.h"
#include "tests/support/model_twins.h"
#include "tests/support/next_token_batches.h"

namespace mt::testing {
namespace {

using namespace mt::models;

// The message of the error `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(DeferredChecks, AnOutOfRangeLabelIsReportedWhenTheLossIsReadNotAtTheOp) {
  Array logits = random_normal({3, 5}, 6);
  Array labels = Array::from_vector(std::vector<int64_t>{1, -100, 7}, {3});
  DeferredChecks checks;
  Array loss, grad;
  // Forward and backward run to the end: the fused kernels read the zeroed copy, in bounds.
  EXPECT_EQ(error_of([&] {
              auto [value, grads] =
                  value_and_grad([&](const Params& q) { return cross_entropy(q["x"], labels); })(Params{{"x", logits}});
              loss = value, grad = grads["x"];
            }),
            "");
  EXPECT_TRUE(std::isfinite(loss.item()));
  for (float g : grad.to_floats()) EXPECT_TRUE(std::isfinite(g));
  EXPECT_GE(checks.pending(), 1u);
  const std::string message = error_of([&] { checks.read(); });
  EXPECT_TRUE(contains(message, "[cross_entropy] label 7 out of range for 5 classes at flat position 2")) << message;
  EXPECT_TRUE(contains(message, "deferred")) << message;
  // Read once: the verdicts are forgotten, a second read finds nothing.
  EXPECT_EQ(checks.pending(), 0u);
  EXPECT_EQ(error_of([&] { checks.read(); }), "");
}

TEST(DeferredChecks, AnOutOfRangeTokenIdGivesAZeroRowUntilItsVerdictIsRead) {
  Array table = random_normal({5, 4}, 2);
  Array ids = Array::from_vector(std::vector<int64_t>{0, 4, 2, 9}, {2, 2});
  // Outside a scope: the immediate error, before any kernel runs.
  const std::string immediate = error_of([&] { embedding(table, ids); });
  EXPECT_TRUE(contains(immediate, "[embedding] index 9 out of range [0, 5) at flat position 3 of indices (2, 2)"))
      << immediate;
  DeferredChecks checks;
  Array rows = embedding(table, ids);
  const std::vector<float> got = rows.to_floats(), t = table.to_floats();
  for (int64_t d = 0; d < 4; ++d) {
    EXPECT_EQ(got[size_t(4 + d)], t[size_t(16 + d)]);  // id 4, looked up as usual
    EXPECT_EQ(got[size_t(12 + d)], t[size_t(d)]);     // id 9 read as 0 until the verdict is read
  }
  const std::string deferred = error_of([&] { checks.read(); });
  EXPECT_TRUE(contains(deferred, "[embedding] index 9 out of range [0, 5) at flat position 3 of indices (2, 2)"))
      << deferred;
}

// A verdict word that cannot be true (overwritten on the device) is reported as meshtrain's
// error, not the data's, and never read past the indices: a position outside them, or one
// whose index is in range.
TEST(DeferredChecks, AVerdictThatCannotBeTrueIsAnInternalErrorNotTheData) {
  const Array indices = Array::from_vector(std::vector<int64_t>{5, 12, 2}, {3}, DType::i64);
  auto verdict = [&](int64_t position) {
    PendingCheck c{Array::from_vector(std::vector<int64_t>{position}, {}, DType::i64), indices,
                   [](int64_t p, int64_t v) { return detail::concat("[take] index ", v, " at ", p); }, 10, -100};
    return c;
  };
  auto read = [&](int64_t position) { return error_of([&] { read_checks({verdict(position)}); }); };
  EXPECT_EQ(read(1).rfind("[take] index 12 at 1 (found when", 0), 0u) << "a true verdict keeps its op's message";
  for (int64_t position : {0, 2, 3, 99, -5}) {
    std::string kind;
    try {
      read_checks({verdict(position)});
    } catch (const VerdictMisfire& e) {
      kind = e.what();
    } catch (const Error& e) {
      kind = std::string("not a misfire: ") + e.what();
    }
    EXPECT_TRUE(contains(kind, "internal error of meshtrain")) << position << ": " << kind;
    EXPECT_TRUE(contains(kind, position == 0 ? "whose index 5 is in range [0, 10)"
                               : position == 2 ? "whose index 2 is in range"
                                               : "which has 3 entries"))
        << kind;
  }
}

TEST(DeferredChecks, ScopesNestAndTheInnermostCollects) {
  Array x = random_normal({4, 3}, 1);
  Array bad = Array::from_vector(std::vector<int32_t>{0, 5}, {2});
  DeferredChecks outer;
  {
    DeferredChecks inner;
    take(x, bad, 0);
    EXPECT_EQ(inner.pending(), 1u);
    EXPECT_EQ(outer.pending(), 0u);
    EXPECT_TRUE(contains(error_of([&] { inner.read(); }), "[take] index 5 out of range [0, 4) at flat position 1"));
  }
  EXPECT_EQ(DeferredChecks::current(), &outer);
  take(x, Array::from_vector(std::vector<int32_t>{3, 1}, {2}), 0);
  EXPECT_EQ(outer.pending(), 1u);
  EXPECT_EQ(error_of([&] { outer.read(); }), "");
}

// An axis of size 0 has no index a bad one could stand in for: the check stops at the op even
// inside a scope, before a kernel could read out of bounds.
TEST(DeferredChecks, IndexingAnEmptyAxisStopsAtTheOpEvenInsideAScope) {
  Array x = random_normal({0, 3}, 1);
  DeferredChecks checks;
  const std::string message = error_of([&] { take(x, Array::from_vector(std::vector<int32_t>{0}, {1}), 0); });
  EXPECT_TRUE(contains(message, "[take] index 0 out of range [0, 0) at flat position 0")) << message;
  EXPECT_EQ(checks.pending(), 0u);
  // No indices at all: nothing to check, nothing read.
  EXPECT_EQ(error_of([&] { take(x, Array::from_vector(std::vector<int32_t>{}, {0}), 0); }), "");
}

TEST(DeferredChecks, ATrainerStepWithABadLabelStopsAndLeavesTheSavedCheckpoint) {
  Gpt2Config c;
  c.vocab_size = 41, c.n_positions = 32, c.n_embd = 24, c.n_layer = 2, c.n_head = 4;
  Params p = random_model_params(gpt2_param_defs(c), 4);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("mt_deferred_checks_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  train::Deployer deployer({.seed = 1, .workdir = dir.string(), .verbose = false});
  std::vector<data::Example> rows;
  for (int64_t i = 0; i < 8; ++i) {
    std::vector<int64_t> t = random_ints({17}, 10 + uint64_t(i), 0, c.vocab_size).to_ints();
    if (i == 4) t[16] = c.vocab_size;  // only a label: row 4 opens step 3's batch
    rows.push_back({{"tokens", t}});
  }
  const auto collate = next_token_collate(16);
  const auto loss = gpt2_next_token_loss(c);
  train::Trainer trainer(deployer, collate, loss, p, optim::adamw(optim::constant_schedule(1e-3)));
  train::FitOptions o;
  o.per_device_batch_size = 2, o.max_steps = 4, o.shuffle = false, o.save_every = 2, o.progress = false;
  // Step 2's checkpoint is still being written when step 3 fails: fit completes it on the way out.
  o.background_checkpoints = true;
  const std::string message = error_of([&] { trainer.fit(data::make_dataset(rows), o); });
  EXPECT_TRUE(contains(message, "step 3")) << message;
  EXPECT_TRUE(contains(message, "label 41 out of range for 41 classes at flat position 15")) << message;
  EXPECT_EQ(trainer.step(), 2);  // the failed step is not counted, though its update was applied
  // The trainer refuses to go on or to save its state, which took the bad step's update.
  EXPECT_TRUE(contains(error_of([&] { trainer.train({collate({rows[0], rows[1]})}); }), "cannot train")) ;
  // The step-2 checkpoint is the latest, and it loads.
  train::CheckpointManager manager((dir / "checkpoints").string());
  ASSERT_TRUE(manager.latest().has_value());
  EXPECT_EQ(std::filesystem::path(*manager.latest()).filename().string(), train::step_name(2));
  EXPECT_EQ(manager.all().size(), 1u);
  const train::CheckpointState saved = train::CheckpointManager::restore(*manager.latest(), deployer.mesh());
  EXPECT_EQ(saved.step, 2);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mt::testing
