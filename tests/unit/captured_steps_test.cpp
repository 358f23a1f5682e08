// The CPU side of the captured step (train/captured_steps.h, issue 45; the captures themselves
// run in tests/gpu/gpu_captured_step_test.cpp): which optimizers can be captured (a host_step
// that does their host half alone), that host_step advances Adam as an update does, how batch
// shapes are told apart, and what a Trainer says when asked to capture where it cannot —
// --cuda-graphs on stops with the reason, auto on the CPU trains eagerly and unchanged.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "meshtrain/models/gpt2.h"
#include "meshtrain/optim/partition.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/train/captured_steps.h"
#include "meshtrain/train/trainer.h"
#include "tests/support/model_twins.h"
#include "tests/support/next_token_batches.h"

namespace mt::testing {
namespace {

using namespace mt::models;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CapturedSteps, ModesParseAndAnUnknownOneIsNamed) {
  EXPECT_EQ(train::parse_cuda_graphs("auto"), train::CudaGraphs::automatic);
  EXPECT_EQ(train::parse_cuda_graphs("on"), train::CudaGraphs::on);
  EXPECT_EQ(train::parse_cuda_graphs("off"), train::CudaGraphs::off);
  EXPECT_EQ(train::to_string(train::CudaGraphs::automatic), "auto");
  EXPECT_NE(error_of([] { train::parse_cuda_graphs("yes"); }).find("expected auto, on or off, got 'yes'"),
            std::string::npos);
}

TEST(CapturedSteps, OptimizersWithAHostStepAreCapturable) {
  const optim::Schedule lr = optim::constant_schedule(1e-3);
  EXPECT_TRUE(optim::capturable(optim::adamw(lr)));
  EXPECT_TRUE(optim::capturable(optim::chain({optim::clip_by_global_norm(1.0), optim::adamw(lr)})));
  EXPECT_TRUE(optim::capturable(optim::partition({{"w.*", optim::adamw(lr)}, {".*", optim::freeze()}})));
  // sgd's rate is a launch argument; multi_steps branches on its host counter.
  EXPECT_FALSE(optim::capturable(optim::sgd(lr)));
  EXPECT_FALSE(optim::capturable(optim::multi_steps(optim::adamw(lr), 2)));
  EXPECT_FALSE(optim::capturable(optim::chain({optim::identity(), optim::sgd(lr)})));
}

TEST(CapturedSteps, HostStepAdvancesAdamsCountAsAnUpdateDoes) {
  // A replayed update runs only host_step on the host: the counters it leaves must be the
  // eager update's, also through a chain and a partition (whose unused rule has no state).
  const optim::Transform t = optim::partition(
      {{"w.*", optim::chain({optim::clip_by_global_norm(1.0), optim::adamw(optim::constant_schedule(1e-2))})},
       {"unused.*", optim::adamw(optim::constant_schedule(1e-2))},
       {".*", optim::freeze()}});
  const Params params{{"w", Array::from_vector(std::vector<float>{1, -2, 3, 0.5f}, {2, 2})},
                      {"b", Array::from_vector(std::vector<float>{1, 2}, {2})}};
  Params eager = t.init(params), replayed = t.init(params);
  const Params grads{{"w", Array::from_vector(std::vector<float>{0.1f, 0.2f, -0.3f, 0.4f}, {2, 2})}};
  for (int step = 1; step <= 3; ++step) {
    t.update(grads, eager, params);
    t.host_step(replayed);
    EXPECT_EQ(eager.at("0.1.count").item(), double(step));
    EXPECT_EQ(replayed.at("0.1.count").item(), double(step));
  }
  EXPECT_FALSE(replayed.contains("1.count"));
}

TEST(CapturedSteps, BatchSignaturesTellShapesAndDtypesApart) {
  const train::Batch a{{"ids", Array::zeros({2, 8}, DType::i64)}, {"labels", Array::zeros({2, 8}, DType::i64)}};
  const train::Batch b{{"ids", Array::zeros({2, 6}, DType::i64)}, {"labels", Array::zeros({2, 6}, DType::i64)}};
  const train::Batch c{{"ids", Array::zeros({2, 8}, DType::i32)}, {"labels", Array::zeros({2, 8}, DType::i64)}};
  EXPECT_EQ(train::batch_signature({a}), train::batch_signature({a}));
  EXPECT_NE(train::batch_signature({a}), train::batch_signature({b}));
  EXPECT_NE(train::batch_signature({a}), train::batch_signature({c}));
  EXPECT_NE(train::batch_signature({a}), train::batch_signature({a, a}));  // two micro-batches
  EXPECT_NE(train::batch_signature({a}).find("ids:i64(2, 8)@cpu"), std::string::npos) << train::batch_signature({a});
}

class CapturedStepsOnTheCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.vocab_size = 41, c_.n_positions = 32, c_.n_embd = 24, c_.n_layer = 2, c_.n_head = 4;
    dir_ = std::filesystem::temp_directory_path() / ("mt_captured_steps_" + std::to_string(getpid()));
    for (int64_t i = 0; i < 8; ++i)
      rows_.push_back({{"tokens", random_ints({17}, 60 + uint64_t(i), 0, c_.vocab_size).to_ints()}});
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::vector<double> fit(train::CudaGraphs mode) {
    train::Deployer deployer({.seed = 1, .workdir = dir_.string(), .verbose = false, .device = "cpu"});
    train::Trainer trainer(deployer, next_token_collate(16), gpt2_next_token_loss(c_),
                           random_model_params(gpt2_param_defs(c_), 4), optim::adamw(optim::constant_schedule(1e-3)));
    train::FitOptions o;
    o.per_device_batch_size = 2, o.max_steps = 4, o.progress = false, o.save_last = false;
    o.cuda_graphs = mode;
    std::vector<double> losses = trainer.fit(data::make_dataset(rows_), o).losses;
    EXPECT_EQ(trainer.captured_step_replays(), 0);
    std::filesystem::remove_all(dir_);
    return losses;
  }
  Gpt2Config c_;
  std::filesystem::path dir_;
  std::vector<data::Example> rows_;
};

TEST_F(CapturedStepsOnTheCpu, OnStopsWithTheReasonAndAutoTrainsEagerly) {
  const std::string refused = error_of([&] { fit(train::CudaGraphs::on); });
  EXPECT_NE(refused.find("[cuda graphs] cannot capture the training step: parameter '"), std::string::npos) << refused;
  EXPECT_NE(refused.find("is on cpu"), std::string::npos) << refused;
  EXPECT_NE(refused.find("--cuda-graphs on"), std::string::npos) << refused;
  const std::vector<double> automatic = fit(train::CudaGraphs::automatic), off = fit(train::CudaGraphs::off);
  ASSERT_EQ(automatic.size(), 4u);
  EXPECT_EQ(automatic, off);
}

TEST_F(CapturedStepsOnTheCpu, EvalStepsRefuseUnderOnAndRunEagerlyUnderAuto) {
  auto eval = [&](train::CudaGraphs mode) {
    train::Deployer deployer({.seed = 1, .workdir = dir_.string(), .verbose = false, .device = "cpu"});
    train::Trainer trainer(deployer, next_token_collate(16), gpt2_next_token_loss(c_),
                           random_model_params(gpt2_param_defs(c_), 4), optim::adamw(optim::constant_schedule(1e-3)));
    trainer.set_cuda_graphs(mode);
    const double loss = trainer.eval_loss(data::make_dataset(rows_), 3);  // 2 batches of 3, a tail of 2
    EXPECT_EQ(trainer.captured_eval_replays(), 0);
    return loss;
  };
  const std::string refused = error_of([&] { eval(train::CudaGraphs::on); });
  EXPECT_NE(refused.find("[cuda graphs] cannot capture the eval step: parameter '"), std::string::npos) << refused;
  EXPECT_NE(refused.find("is on cpu"), std::string::npos) << refused;
  EXPECT_EQ(eval(train::CudaGraphs::automatic), eval(train::CudaGraphs::off));
}

// CapturedForward's own rules, where no capture can succeed (no GPU here): nothing is tried
// while ops are observed (a profile); a shape is captured after a clean eager run; a failed capture is said once and the forward goes on eagerly with
// the same results (automatic) or stops naming the batch (on); a forward that reads to the
// host is left eager after three runs, with the reason.
TEST(CapturedForward, AFailedCaptureFallsBackEagerlyOrStopsUnderOn) {
  const train::Batch batch{{"x", Array::full({2, 3}, 1.5f)}};
  const Params reads{{"w", Array::full({3}, 2.0f)}};
  int calls = 0;
  auto forward = [&](const train::Batch& b) {
    ++calls;
    train::ForwardResults r;
    r.loss = mul(b.at("x"), reads.at("w"));
    return r;
  };
  std::vector<std::string> said;
  train::CapturedForward automatic(train::CudaGraphs::automatic, "the test forward",
                                   [&](const std::string& line) { said.push_back(line); });
  // While ops are observed (--profile drains the queue around each kernel) nothing is tried.
  prim::set_op_observer([](const prim::OpEvent&) {});
  for (int i = 0; i < 3; ++i) automatic.run(batch, reads, forward);
  prim::set_op_observer({});
  EXPECT_TRUE(said.empty());
  calls = 0;
  for (int i = 0; i < 4; ++i) {
    const train::ForwardResults r = automatic.run(batch, reads, forward);
    EXPECT_EQ(r.loss.to_floats(), std::vector<float>(6, 3.0f));
  }
  EXPECT_EQ(calls, 4);  // the failed capture recorded nothing that counts; each run computed
  ASSERT_EQ(said.size(), 1u);
  std::cout << "  " << said[0] << "\n";
  EXPECT_NE(said[0].find("[cuda graphs] the test forward runs eagerly: batch x:f32(2, 3)@cpu"), std::string::npos)
      << said[0];
  EXPECT_EQ(automatic.replays(), 0);

  train::CapturedForward on(train::CudaGraphs::on, "the test forward", nullptr);
  on.run(batch, reads, forward);  // eager and clean: the next run captures
  const std::string refused = error_of([&] { on.run(batch, reads, forward); });
  EXPECT_NE(refused.find("[cuda graphs] cannot capture the test forward: batch x:f32(2, 3)@cpu"), std::string::npos)
      << refused;

  said.clear();
  train::CapturedForward reading(train::CudaGraphs::automatic, "the reading forward",
                                 [&](const std::string& line) { said.push_back(line); });
  auto reads_to_host = [&](const train::Batch& b) {
    train::ForwardResults r;
    r.loss = Array::full({1}, b.at("x").to_floats()[0]);
    return r;
  };
  for (int i = 0; i < 4; ++i) reading.run(batch, reads, reads_to_host);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("it reads 1 values to the host"), std::string::npos) << said[0];
}

}  // namespace
}  // namespace mt::testing
