// Metrics a loss function records beside its loss (train/step_metrics.h): averaged over a
// step's micro-batches, weighted by rows in evaluation (the tail batch too), logged in
// metrics.jsonl under their names and drawn in curves.svg, one panel per group; a loss
// called outside a recording scope records nothing, and a non-scalar is refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/meshtrain.h"
#include "meshtrain/train/step_metrics.h"
#include "tests/support/op_check.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

// y = 2·x over rows x = 0, 1, 2, ...; the model y ≈ w·x with w from 0.
std::shared_ptr<const data::Dataset> rows(int64_t n, int64_t first = 0) {
  std::vector<data::Example> ex;
  for (int64_t i = 0; i < n; ++i) ex.push_back({{"x", double(first + i)}});
  return data::make_dataset(ex);
}

Batch collate(const std::vector<data::Example>& ex) {
  std::vector<float> x;
  for (const data::Example& e : ex) x.push_back(float(e.as_float("x")));
  return Batch{{"x", Array::from_vector(x, {int64_t(x.size())})}};
}

// Squared error, recording the mean residual and the batch's mean x (the rows it saw).
Array loss(const Params& p, const Batch& b, const RngKey&) {
  const Array residual = sub(mul(b["x"], p["w"]), mul(b["x"], scalar_like(b["x"], 2.0)));
  record_metric("fit/residual", mean(residual));
  record_metric("fit/x", mean(b["x"]));
  record_metric("half_x", mul(mean(b["x"]), scalar_like(b["x"], 0.5)));
  return mean(square(residual));
}

TEST(StepMetrics, StepMeansEvalWeightsAndLogs) {
  const fs::path dir = fs::temp_directory_path() / ("mt_step_metrics_" + std::to_string(getpid()));
  fs::remove_all(dir);
  Deployer deployer({.seed = 1, .workdir = dir.string(), .verbose = false});
  Params p;
  p.set("w", Array::from_vector(std::vector<float>{0.f}, {1}));
  Trainer trainer(deployer, collate, loss, p, optim::sgd(optim::constant_schedule(0.0)));  // lr 0: w stays 0
  FitOptions o;
  o.per_device_batch_size = 2;
  o.grad_accum_steps = 2;
  o.shuffle = false;
  o.max_steps = 2;
  o.eval_data = rows(5, 10);  // two batches of 2 and a tail of 1: x 10..14
  o.eval_every = 1;
  o.progress = true;
  FitResult r = trainer.fit(rows(8), o);
  // Step 2 saw x = 4, 5 and 6, 7: the micro-batch means 4.5 and 6.5 averaged.
  const auto& m = trainer.last_step_metrics();
  EXPECT_DOUBLE_EQ(m.at("fit/x"), 5.5);
  EXPECT_DOUBLE_EQ(m.at("fit/residual"), -11.0);  // w = 0: residual = -2x
  EXPECT_DOUBLE_EQ(m.at("half_x"), 2.75);
  // Evaluation weighs by rows: the mean of x over 10..14 is 12, not the batch means' mean.
  const auto ev = trainer.eval_metrics(o.eval_data, 2);
  EXPECT_DOUBLE_EQ(ev.at("eval_fit/x"), 12.0);
  EXPECT_DOUBLE_EQ(ev.at("eval_fit/residual"), -24.0);
  EXPECT_NEAR(ev.at("eval_loss"), (400 + 484 + 576 + 676 + 784) / 5.0, 1e-3);
  ASSERT_EQ(r.evals.size(), 2u);
  EXPECT_DOUBLE_EQ(r.evals.back().at("eval_fit/x"), 12.0);

  std::ifstream in(dir / "metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  int train_lines = 0;
  for (const auto& j : lines) {
    if (j["split"] == "train") {
      ++train_lines;
      EXPECT_DOUBLE_EQ(j["fit/x"].get<double>(), j["step"] == 1 ? 1.5 : 5.5);
    } else {
      EXPECT_DOUBLE_EQ(j["eval_fit/x"].get<double>(), 12.0);
    }
  }
  EXPECT_EQ(train_lines, 2);
  std::ifstream svg(dir / "curves.svg");
  const std::string text((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_NE(text.find("data-title=\"fit\""), std::string::npos);
  EXPECT_NE(text.find("data-title=\"half_x\""), std::string::npos);
  fs::remove_all(dir);
}

TEST(StepMetrics, OutsideAScopeNothingAndScalarsOnly) {
  Params p;
  p.set("w", Array::from_vector(std::vector<float>{1.f}, {1}));
  EXPECT_NO_THROW(loss(p, collate({{{"x", 1.0}}}), RngKey{0, 0}));  // no recorder: a no-op
  MetricRecorder outer;
  {
    MetricRecorder inner;
    record_metric("a", Array::from_vector(std::vector<float>{1.f}, {1}));
    record_metric("a", Array::from_vector(std::vector<float>{2.f}, {1}));  // same name: summed
    auto got = inner.take();
    ASSERT_EQ(got.size(), 1u);
    EXPECT_DOUBLE_EQ(got.at("a").item(), 3.0);
  }
  EXPECT_TRUE(outer.take().empty());  // the inner scope recorded
  EXPECT_EQ(mt::testing::error_of([] { record_metric("v", Array::from_vector(std::vector<float>{1.f, 2.f}, {2})); }),
            "[metrics] record_metric('v'): a metric is a scalar, got shape (2,)");
}

}  // namespace
}  // namespace mt::train
