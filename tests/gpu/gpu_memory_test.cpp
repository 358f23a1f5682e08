// Training's device memory follows its state (issue 50's proof on the GPU; the CPU's is
// tests/spmd/training_memory_test.cpp). A GPT-2 that is wide and shallow, fed few tokens per
// step, holds ~28 M parameters: its AdamW state (weights and two f32 moments, 12 bytes per
// parameter) and f32 gradients (4 more) dwarf its activations, so a transient copy of the
// weights (114 MB) cannot hide under the fixed margin. Three steps, eager and captured, f32
// and bf16 (whose per-step bf16 copies of the weights, 2 bytes per parameter, live through
// the backward pass and are allowed for).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "meshtrain/models/gpt2.h"
#include "meshtrain/autodiff/precision_policy.h"
#include "meshtrain/train/trainer.h"
#include "tests/support/gpu.h"
#include "tests/support/model_twins.h"
#include "tests/support/next_token_batches.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

constexpr double kMb = 1e6;

models::Gpt2Config wide_shallow_gpt2() {
  models::Gpt2Config c;
  c.vocab_size = 256, c.n_positions = 32, c.n_embd = 768, c.n_layer = 4, c.n_head = 8;
  return c;
}

double bytes_of(const Params& tree) {
  double total = 0;
  for (const auto& [path, a] : tree)
    if (a.defined() && a.device().is_cuda()) total += double(a.nbytes());
  return total;
}

class GpuMemory : public TempDir {
 protected:
  void check(const std::string& precision, train::CudaGraphs graphs) {
    PrecisionScope scope(precision_policy_from_name(precision));
    const models::Gpt2Config c = wide_shallow_gpt2();
    const std::string label = precision + (graphs == train::CudaGraphs::off ? ", eager" : ", captured");
    train::Deployer deployer({.seed = 5, .workdir = (dir_ / label).string(), .verbose = false, .device = "cuda"});
    const Device gpu = Device::cuda(0);
    train::Trainer trainer(deployer, next_token_collate(16), gpt2_next_token_loss(c),
                           random_model_params(models::gpt2_param_defs(c), 4, 0.02),
                           optim::chain({optim::clip_by_global_norm(1.0),
                                         optim::adamw(optim::constant_schedule(1e-4), 0.9, 0.95, 1e-8, 0.01)}));
    trainer.set_cuda_graphs(graphs);
    cuda_runtime().synchronize();
    cuda_runtime().reset_peak(0);
    for (int64_t s = 0; s < 4; ++s) {
      std::vector<data::Example> rows;
      for (int64_t i = 0; i < 2; ++i)
        rows.push_back({{"tokens", random_ints({17}, uint64_t(100 * s + i), 0, c.vocab_size).to_ints()}});
      trainer.train({deployer.shard_batch(next_token_batch(rows, 16))});
    }
    cuda_runtime().synchronize();
    const double weights = bytes_of(trainer.params()), moments = bytes_of(trainer.opt_state());
    const double peak = double(cuda_runtime().memory_stats(gpu.index).peak_bytes_in_use);
    const double casts = precision == "bf16" ? weights / 2 : 0.0;
    // Fixed margin: the activations of 32 tokens, the loss, the clip norm, the checks' words.
    const double bound = weights + moments + weights + casts + 24 * kMb;
    std::printf("  device peak %s: %.1f MB; weights %.1f MB, moments %.1f MB, gradients %.1f MB, "
                "bf16 casts %.1f MB; bound %.1f MB\n",
                label.c_str(), peak / kMb, weights / kMb, moments / kMb, weights / kMb, casts / kMb, bound / kMb);
    EXPECT_NEAR(moments, 2 * weights, 1024) << "AdamW keeps two f32 moments per weight";
    EXPECT_LE(peak, bound) << label << ": the step holds more than the state, its gradients and the activations";
    EXPECT_GE(peak, weights + moments) << label << ": the peak misses the state";
  }
};

TEST_F(GpuMemory, PeakIsTheStateGradientsAndAFixedMarginEagerAndCaptured) {
  MT_REQUIRE_GPU();
  for (const char* precision : {"f32", "bf16"})
    for (train::CudaGraphs graphs : {train::CudaGraphs::off, train::CudaGraphs::on}) check(precision, graphs);
}

}  // namespace
}  // namespace mt::testing
