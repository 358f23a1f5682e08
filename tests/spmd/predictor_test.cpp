// The Predictor on 1 and 4 ranks: every example predicted once, in order, padding of the
// last batch dropped, equal to computing the predictions directly on one device; a bad token id
// is reported with its position after its batch (the check's verdict stays on the device until
// the outputs are read, so the step can be captured); --cuda-graphs on says why it cannot
// capture on the CPU. (Captured predictions against eager ones: tests/gpu/gpu_captured_step_test.)
#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/train/predictor.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

TEST(Predictor, KeepsOrderDropsPaddingOnAnyMesh) {
  const int n = dist::world().size();
  const int64_t examples = 13, features = 6, classes = 5;  // 13 never fills the batches
  // Inputs and weights are multiples of 1/256 with few bits, so every product and sum is
  // exact in f32: the argmax cannot flip with the GEMM's summation order (which differs
  // between shard shapes and CPUs).
  Array x = random_normal({examples, features}, 1);
  std::vector<float> wq;
  for (double v : random_normal({features, classes}, 2).to_doubles()) wq.push_back(float(std::lround(v * 256)) / 256.0f);
  Array w = Array::from_vector(wq, {features, classes});
  std::vector<data::Example> rows;
  auto xv = x.to_doubles();
  for (int64_t i = 0; i < examples; ++i) {
    data::Example e;
    e.set("id", i);
    std::vector<int64_t> q;
    for (int64_t j = 0; j < features; ++j) q.push_back(int64_t(std::lround(xv[size_t(i * features + j)] * 256)));
    e.set("x", q);
    rows.push_back(e);
  }
  auto collate = [&](const std::vector<data::Example>& ex) {
    std::vector<float> v;
    std::vector<int64_t> ids;
    for (const auto& e : ex) {
      for (int64_t q : e.tokens("x")) v.push_back(float(q) / 256.0f);
      ids.push_back(e.as_int("id"));
    }
    const int64_t b = int64_t(ex.size());
    return train::Batch{{"x", Array::from_vector(v, {b, features})}, {"id", Array::from_vector(ids, {b})}};
  };
  for (const std::string& spec : {std::string("data=") + std::to_string(n), std::string(n == 4 ? "data=2,model=2" : "")}) {
    if (spec.empty()) continue;
    train::Deployer deployer({.mesh = spec, .verbose = false});
    Params params{{"w", w}};
    train::Predictor<std::pair<int64_t, int64_t>> predictor(
        deployer, collate,
        [](const Params& p, const train::Batch& b) {
          return train::Batch{{"class", argmax(matmul(b["x"], p["w"]), -1)}, {"id", b["id"]}};
        },
        [](const train::Batch& h) {
          std::vector<std::pair<int64_t, int64_t>> out;
          auto c = h["class"].to_ints(), id = h["id"].to_ints();
          for (size_t i = 0; i < c.size(); ++i) out.emplace_back(id[i], c[i]);
          return out;
        });
    auto preds = predictor.predict(params, data::make_dataset(rows), 2);
    ASSERT_EQ(int64_t(preds.size()), examples) << spec;
    // The same inputs (as collated) on one device.
    auto direct = argmax(matmul(collate(rows)["x"], w), -1).to_ints();
    for (int64_t i = 0; i < examples; ++i) {
      EXPECT_EQ(preds[size_t(i)].first, i) << spec;
      EXPECT_EQ(preds[size_t(i)].second, direct[size_t(i)]) << spec << " example " << i;
    }
  }
}

// Rows of token ids, one per example, and a predictor of each row's embedding sum.
std::vector<data::Example> id_rows(const std::vector<std::vector<int64_t>>& ids) {
  std::vector<data::Example> rows;
  for (const auto& r : ids) rows.push_back({{"ids", r}});
  return rows;
}

train::Predictor<double> embedding_sum_predictor(train::Deployer& deployer) {
  auto collate = [](const std::vector<data::Example>& ex) {
    std::vector<int64_t> ids;
    for (const auto& e : ex)
      for (int64_t t : e.tokens("ids")) ids.push_back(t);
    const int64_t b = int64_t(ex.size());
    return train::Batch{{"ids", Array::from_vector(ids, {b, int64_t(ids.size()) / b})}};
  };
  return train::Predictor<double>(
      deployer, collate,
      [](const Params& p, const train::Batch& b) {
        return train::Batch{{"sum", sum(embedding(p["table"], b["ids"]), std::vector<int>{1, 2})}};
      },
      [](const train::Batch& h) { return h["sum"].to_doubles(); });
}

TEST(Predictor, ABadTokenIdIsReportedWithItsPositionAfterItsBatch) {
  const int n = dist::world().size();
  train::Deployer deployer({.mesh = "data=" + std::to_string(n), .verbose = false});
  const Params params{{"table", Array::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {4, 2})}};
  std::vector<std::vector<int64_t>> ids = {{0, 1, 2}, {3, 2, 1}, {1, 1, 1}, {2, 0, 3}, {0, 0, 0}, {3, 3, 3}, {1, 2, 3}, {2, 2, 2}};
  // Every row's sum, directly.
  const std::vector<double> expected = {3 + 7 + 11, 15 + 11 + 7, 21, 11 + 3 + 15, 9, 45, 7 + 11 + 15, 33};
  train::Predictor<double> predictor = embedding_sum_predictor(deployer);
  EXPECT_EQ(predictor.predict(params, data::make_dataset(id_rows(ids)), 8 / n), expected);
  EXPECT_EQ(predictor.captured_replays(), 0);  // nothing is captured on the CPU
  // Token 4 of a 4-row table in the third place of each rank's last row (every rank finds it,
  // so all stop together): flat position 2 of that row in the rank's shard of 8/n rows.
  const int64_t rows_per_rank = 8 / n;
  for (int r = 0; r < n; ++r) ids[size_t((r + 1) * rows_per_rank - 1)][2] = 4;
  std::string message;
  try {
    predictor.predict(params, data::make_dataset(id_rows(ids)), 8 / n);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("index 4 out of range [0, 4) at flat position " + std::to_string((rows_per_rank - 1) * 3 + 2)),
            std::string::npos)
      << message;
}

TEST(Predictor, CudaGraphsOnSaysWhyThePredictStepCannotBeCaptured) {
  const int n = dist::world().size();
  train::Deployer deployer({.mesh = "data=" + std::to_string(n), .verbose = false});
  const Params params{{"table", Array::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {4, 2})}};
  train::Predictor<double> predictor = embedding_sum_predictor(deployer);
  predictor.set_cuda_graphs(train::CudaGraphs::on);
  std::string message;
  try {
    predictor.predict(params, data::make_dataset(id_rows({{0, 1}, {2, 3}, {1, 0}, {3, 2}})), 4 / n);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("cannot capture the predict step"), std::string::npos) << message;
  const std::string why = n > 1 ? "reduced across " + std::to_string(n) + " processes" : "parameter 'table' is on cpu";
  EXPECT_NE(message.find(why), std::string::npos) << message;
}

}  // namespace
}  // namespace mt::testing
