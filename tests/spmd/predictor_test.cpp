// The Predictor on 1 and 4 ranks: every example predicted once, in order, padding of the
// last batch dropped, equal to computing the predictions directly on one device.
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

}  // namespace
}  // namespace mt::testing
