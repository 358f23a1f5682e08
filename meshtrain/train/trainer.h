#pragma once
// The Trainer (DESIGN.md §7): the user's collate and loss functions, parameters and an
// optimizer; fit runs epochs or steps over a dataset with gradient accumulation, periodic
// evaluation, checkpoints (every N steps, last, best by a metric) and exact resume. Metrics
// of a step are read by a background writer while the next step runs.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/data/dataset.h"
#include "meshtrain/data/example.h"
#include "meshtrain/optim/transform.h"
#include "meshtrain/train/deployer.h"

namespace mt::train {

// This process's examples -> its slice of the batch (host arrays, first dim = examples).
using CollateFn = std::function<Batch(const std::vector<data::Example>&)>;
// (params, global batch, random key of the step) -> scalar loss.
using LossFn = std::function<Array(const Params&, const Batch&, const RngKey&)>;
// Evaluation beyond the loss (e.g. a Predictor plus a metric function) -> named metrics.
using EvalFn = std::function<std::map<std::string, double>(const Params&)>;

struct FitOptions {
  int64_t per_device_batch_size = 8;
  int64_t epochs = 1;
  int64_t max_steps = -1;  // stop after this many optimizer steps (-1: run all epochs)
  int grad_accum_steps = 1;
  bool shuffle = true;
  // Evaluation: the mean loss over eval_data and eval_fn's metrics, every eval_every steps
  // (0: at the end of each epoch).
  std::shared_ptr<const data::Dataset> eval_data;
  int64_t per_device_eval_batch_size = 0;  // 0: per_device_batch_size
  int64_t eval_every = 0;
  EvalFn eval_fn;
  // Checkpoints in <workdir>/checkpoints: every save_every steps (0: never), the last one,
  // and the best by "max:<metric>" or "min:<metric>" (e.g. "min:eval_loss").
  int64_t save_every = 0;
  bool save_last = true;
  int keep_last = 3;
  std::string save_best_by;
  // Continue from the newest checkpoint in the workdir, exactly where it stopped.
  bool resume = false;
  bool progress = true;  // progress bar, metrics.jsonl and TensorBoard events (rank 0)
};

struct FitResult {
  std::vector<double> losses;  // per optimizer step, this run's steps only
  std::vector<std::map<std::string, double>> evals;
  int64_t steps = 0;  // optimizer steps completed, including resumed ones
};

class Trainer {
 public:
  Trainer(Deployer& deployer, CollateFn collate, LossFn loss, Params params, optim::Transform optimizer,
          std::optional<ShardingPlan> plan = std::nullopt);

  FitResult fit(std::shared_ptr<const data::Dataset> train, const FitOptions& options);
  // The mean loss over a dataset (weighted by batch, no dropout-key changes).
  double eval_loss(std::shared_ptr<const data::Dataset> data, int64_t per_device_batch_size);

  const Params& params() const { return params_; }
  const Params& opt_state() const { return opt_state_; }
  int64_t step() const { return step_; }
  const ShardingPlan* plan() const { return plan_ ? &*plan_ : nullptr; }

 private:
  double train_step(const std::vector<Batch>& micro_batches);
  void save_checkpoint(const std::string& kind, const nlohmann::json& data_state, const std::string& metric = "",
                       double value = 0, const std::string& mode = "");
  std::optional<nlohmann::json> restore_latest();
  dist::PartitionSpec spec_for(const std::string& group, const std::string& path) const;

  Deployer& deployer_;
  CollateFn collate_;
  LossFn loss_;
  Params params_;
  optim::Transform optimizer_;
  Params opt_state_;
  std::optional<ShardingPlan> plan_;
  int64_t step_ = 0;
};

}  // namespace mt::train
