// The Deployer on one process: its mesh, keys and Redco-style learning-rate schedules sized
// from the dataset and the global batch.
#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/train/deployer.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

TEST(Deployer, LearningRateScheduleFromDataSize) {
  train::Deployer d({.seed = 1, .workdir = "runs/unused", .verbose = false});
  EXPECT_EQ(d.data_size(), 1);
  // 100 examples, 10 per step, 2 epochs: 20 steps, 10% (2 steps) warmup.
  const double lr = 1e-3;
  optim::Schedule linear = d.lr_schedule(100, 10, 2, lr, "linear", 0.1);
  EXPECT_DOUBLE_EQ(linear(0), 0.0);
  EXPECT_DOUBLE_EQ(linear(1), lr / 2);
  EXPECT_DOUBLE_EQ(linear(2), lr);
  EXPECT_NEAR(linear(11), lr * 9.0 / 18.0, 1e-15);
  EXPECT_NEAR(linear(20), 0.0, 1e-15);
  optim::Schedule cosine = d.lr_schedule(100, 10, 2, lr, "cosine", 0.1);
  EXPECT_NEAR(cosine(11), lr * 0.5, 1e-12);  // halfway through the decay
  optim::Schedule constant = d.lr_schedule(100, 10, 2, lr, "constant", 0.1);
  EXPECT_DOUBLE_EQ(constant(1), lr / 2);
  EXPECT_DOUBLE_EQ(constant(15), lr);
  // Accumulation makes fewer, larger steps: 100 / (10 x 5) x 2 = 4 steps.
  optim::Schedule accum = d.lr_schedule(100, 10, 2, lr, "linear", 0.0, 5);
  EXPECT_NEAR(accum(2), lr / 2, 1e-15);
  expect_error([&] { d.lr_schedule(100, 10, 2, lr, "step"); }, {"unknown schedule_type 'step'"});
  expect_error([&] { d.lr_schedule(5, 10, 2, lr); }, {"5 examples make no step of 10"});
  expect_error([&] { d.lr_schedule(100, 10, 2, lr, "linear", 1.0); }, {"warmup_rate"});
  // Step keys differ per step and are reproducible.
  auto words = [](const RngKey& k) { return std::make_pair(k.seed, k.stream); };
  EXPECT_NE(words(d.step_key(1)), words(d.step_key(2)));
  EXPECT_EQ(words(d.step_key(7)), words(train::Deployer({.seed = 1, .verbose = false}).step_key(7)));
  EXPECT_NE(words(d.step_key(7)), words(train::Deployer({.seed = 2, .verbose = false}).step_key(7)));
}

}  // namespace
}  // namespace mt::testing
