// Training's host memory follows its state. A GPT whose state is known exactly (AdamW: the
// weights, two f32 moments and f32 gradients, 16 bytes per parameter, split over the ranks by
// FSDP) trains within that state, the activations and a fixed margin far below one copy of
// the weights, so a transient copy of the parameters, gradients or moments fails it; the dry
// run's measured step (FitOptions::dry_run) says the peak within 15 %. On real text (Tiny
// Shakespeare), with the clipping + AdamW chain the CLI uses.
#include <gtest/gtest.h>

#include <filesystem>
#include <cmath>
#include <regex>

#include "meshtrain/autodiff/precision_policy.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/train/trainer.h"
#include "tests/support/shakespeare_lm.h"
#include "tests/support/tiny_gpt.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
constexpr double kMb = 1e6;

// Wide and shallow, with few tokens per step: the state (~100 MB of weights) dwarfs the
// activations, so a copy of it cannot hide among them.
TinyGptConfig config() {
  TinyGptConfig c;
  c.vocab = 256;  // bytes
  c.width = 768;
  c.heads = 8;
  c.layers = 4;
  c.time = 16;
  c.batch = 2;  // per step, over all ranks
  c.dropout = 0.0;
  return c;
}

std::shared_ptr<const data::Dataset> shakespeare(int64_t seq_len) { return shakespeare_bytes(seq_len, 20000); }

// A fresh trainer over the model's parameters (moved in), FSDP over the ranks.
std::unique_ptr<train::Trainer> make_trainer(train::Deployer& deployer, const TinyGptConfig& c) {
  Params host = tiny_gpt_init(c, "single", nullptr);
  train::ShardingOptions so;
  so.fsdp = deployer.data_size() > 1;
  train::ShardingPlan plan = deployer.sharding_rules(host, tiny_gpt_roles(c), so);
  auto loss = [c](const Params& p, const train::Batch& b, const RngKey& key) {
    TinyGptConfig sized = c;
    sized.batch = b["ids"].dim(0);
    return tiny_gpt_loss(sized, p, b["ids"], b["labels"], key.stream);
  };
  optim::Transform opt = optim::chain(
      {optim::clip_by_global_norm(1.0), optim::adamw(optim::constant_schedule(1e-3), 0.9, 0.95, 1e-8, 0.01)});
  return std::make_unique<train::Trainer>(deployer, next_token_batch, loss, std::move(host), opt, plan);
}

double local_bytes(const Params& tree) {
  double total = 0;
  for (const auto& [path, a] : tree) total += double(dist::local_view(a).nbytes());
  return total;
}

double number_after(const std::string& text, const std::string& label) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(text, m, std::regex(label + " ([0-9.]+) GB"))) << label << " in: " << text;
  return m.empty() ? 0.0 : std::stod(m[1]) * 1e9;
}

// Under `precision` (bf16: the parameters' bf16 copies must be gone by the backward pass's
// end, else their 2 bytes per parameter count as activations and fail the bound).
void check_training_memory(const std::string& precision) {
  PrecisionScope scope(precision_policy_from_name(precision));
  const TinyGptConfig c = config();
  const std::string dir = (fs::temp_directory_path() /
                           ("mt_training_memory_" + precision + "_np" + std::to_string(dist::world().size())))
                              .string();
  if (dist::world().rank() == 0) fs::remove_all(dir);
  dist::world().barrier();
  train::Deployer deployer({.seed = 5, .workdir = dir, .verbose = false});
  train::FitOptions o;
  o.per_device_batch_size = c.batch / deployer.data_size();
  o.max_steps = 3;
  o.progress = false;
  o.eval_at_end = false;

  // The dry run: one step measured, then DryRunDone; that trainer is dropped.
  std::string dry;
  {
    std::unique_ptr<train::Trainer> trainer = make_trainer(deployer, c);
    train::FitOptions d = o;
    d.dry_run = true;
    try {
      trainer->fit(shakespeare(c.time), d);
      ADD_FAILURE() << "the dry run trained";
    } catch (const train::DryRunDone& e) {
      dry = e.what();
    }
  }
  EXPECT_FALSE(fs::exists(fs::path(dir) / "checkpoints")) << "a dry run saves nothing";
  dist::world().barrier();

  std::unique_ptr<train::Trainer> trainer = make_trainer(deployer, c);
  const double weights = local_bytes(trainer->params()), moments = local_bytes(trainer->opt_state());
  EXPECT_NEAR(moments, 2 * weights, 1024) << "AdamW keeps two f32 moments per weight";
  const double gradients = weights;  // every parameter is trained, in f32
  const double state = weights + moments;
  CachingAllocator::instance().reset_peak();
  const double before = double(CachingAllocator::instance().stats().bytes_in_use);
  train::FitResult r = trainer->fit(shakespeare(c.time), o);
  ASSERT_EQ(r.losses.size(), 3u);
  // (The tiny GPT's fixed init scales are meant for narrow widths: at 768 its loss starts
  // high and is not this test's subject; it must stay a number.)
  for (double loss : r.losses) EXPECT_TRUE(std::isfinite(loss));
  // What the arrays held at most, counting the state once (it was allocated before fit).
  const double peak = state + double(CachingAllocator::instance().stats().peak_bytes_in_use) - before;

  const double dry_peak = number_after(dry, "= peak"), dry_activations = number_after(dry, "temporaries");
  std::printf("[rank %d, %s] weights %.1f MB, state + gradients %.1f MB; fit peak %.1f MB; dry run: peak %.1f MB, "
              "activations %.1f MB\n",
              dist::world().rank(), precision.c_str(), weights / kMb, (state + gradients) / kMb, peak / kMb, dry_peak / kMb,
              dry_activations / kMb);
  // The dry run's activations are activations: far below a copy of the weights. Under FSDP
  // they also hold the gathered whole weights: this model has no --remat, and each layer's
  // matmul keeps the weight it gathered for its backward pass (a known cost, to be removed by
  // re-gathering in the backward pass).
  const double gathered = deployer.data_size() > 1 ? weights * double(deployer.data_size()) : 0.0;
  EXPECT_LT(dry_activations, 0.25 * weights + gathered) << dry;
  // Fixed margin: 4 MB for the loss, the clip norm and the allocator's rounding.
  EXPECT_LE(peak, state + gradients + dry_activations + 4 * kMb)
      << "the step holds more than the state, its gradients and the activations";
  EXPECT_NEAR(dry_peak, peak, 0.15 * peak) << dry;

  // Resuming reads the checkpoint the fit left into the new trainer's own arrays: no second
  // copy of the state, and the moments stay in place for the next step.
  trainer.reset();
  std::unique_ptr<train::Trainer> resumed = make_trainer(deployer, c);
  train::FitOptions more = o;
  more.max_steps = 4;
  more.resume = true;
  CachingAllocator::instance().reset_peak();
  const double before_resume = double(CachingAllocator::instance().stats().bytes_in_use);
  train::FitResult after = resumed->fit(shakespeare(c.time), more);
  EXPECT_EQ(after.losses.size(), 1u) << "the resumed run continues at step 4";
  const double resume_peak = state + double(CachingAllocator::instance().stats().peak_bytes_in_use) - before_resume;
  std::printf("[rank %d, %s] resumed: peak %.1f MB\n", dist::world().rank(), precision.c_str(), resume_peak / kMb);
  EXPECT_LE(resume_peak, state + gradients + dry_activations + 4 * kMb) << "the resume holds a second copy";
}

TEST(TrainingMemory, PeakIsTheStateActivationsAndAFixedMargin) { check_training_memory("f32"); }

TEST(TrainingMemory, Bf16AddsNoCopyOfTheWeightsToThePeak) { check_training_memory("bf16"); }

}  // namespace
}  // namespace mt::testing
