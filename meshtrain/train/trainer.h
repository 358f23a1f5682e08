#pragma once
// The Trainer (DESIGN.md §7): the user's collate and loss functions, parameters and an
// optimizer; fit runs epochs or steps over a dataset with gradient accumulation, periodic
// evaluation, checkpoints (every N steps, last, best by a metric) and exact resume. Metrics
// of a step are read by a background writer while the next step runs.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/data/data_loader.h"
#include "meshtrain/data/dataset.h"
#include "meshtrain/data/example.h"
#include "meshtrain/ops/deferred_checks.h"
#include "meshtrain/optim/loss_scale.h"
#include "meshtrain/optim/transform.h"
#include "meshtrain/train/deployer.h"
#include "meshtrain/train/async_metric_writer.h"
#include "meshtrain/train/background_checkpoints.h"
#include "meshtrain/train/batch_shapes.h"
#include "meshtrain/train/captured_forward.h"
#include "meshtrain/train/captured_steps.h"
#include "meshtrain/train/step_metrics.h"

namespace mt::train {

class ProgressBar;
class AsyncMetricWriter;
struct BestMetric;

// This process's examples -> its slice of the batch (host arrays, first dim = examples).
using CollateFn = std::function<Batch(const std::vector<data::Example>&)>;
// (params, global batch, random key of the step, training?) -> scalar loss. `training` is
// false when the Trainer evaluates (eval_loss): no dropout then. A loss function without
// the flag (params, batch, key) is accepted too.
using LossFn = std::function<Array(const Params&, const Batch&, const RngKey&, bool training)>;
// A replacement for the default optimizer step (value_and_grad over each micro-batch,
// mean of the gradients, optimizer update): updates params and opt_state in place and
// returns the step's loss. Its key, like the default step's, folds the step number in last
// from a device scalar (RngKey::fold_last): kernels draw from it as it is; host code that
// draws from it takes key.host_resolved().
using TrainStepFn = std::function<double(Params& params, Params& opt_state, const std::vector<Batch>& micro_batches,
                                         const RngKey& key)>;

// Turns a step's micro-batches into the ones the loss sees, with the parameters of that step
// in hand: reinforcement learning's rollout (generate with the current policy, score, return
// the scored completions as batches). Called on every rank before each step (collectives
// allowed); `step` counts optimizer steps from 0.
using RolloutFn = std::function<std::vector<Batch>(const Params& params, const std::vector<Batch>& micro_batches,
                                                   int64_t step, const RngKey& key)>;

template <class F>
LossFn to_loss_fn(F f) {
  if constexpr (std::is_invocable_v<F, const Params&, const Batch&, const RngKey&, bool>) {
    return LossFn(std::move(f));
  } else {
    static_assert(std::is_invocable_v<F, const Params&, const Batch&, const RngKey&>,
                  "a loss function takes (params, batch, key) or (params, batch, key, training)");
    return [f = std::move(f)](const Params& p, const Batch& b, const RngKey& k, bool) { return f(p, b, k); };
  }
}
// Evaluation beyond the loss (e.g. a Predictor plus a metric function) -> named metrics.
using EvalFn = std::function<std::map<std::string, double>(const Params&)>;

struct FitOptions {
  int64_t per_device_batch_size = 8;
  int64_t epochs = 1;
  int64_t max_steps = -1;  // stop after this many optimizer steps (-1: run all epochs)
  int grad_accum_steps = 1;
  bool shuffle = true;
  // Evaluation: the mean loss over eval_data (the mean of per-batch losses over its full
  // global batches; a tail smaller than a batch is left out) and eval_fn's metrics, every
  // eval_every steps and at the end of each epoch.
  std::shared_ptr<const data::Dataset> eval_data{};
  int64_t per_device_eval_batch_size = 0;  // 0: per_device_batch_size
  int64_t eval_every = 0;
  EvalFn eval_fn{};
  bool eval_at_end = true;  // also after the last step when it was not just evaluated
  // Checkpoints in <workdir>/checkpoints: every save_every steps (0: never), the last one,
  // and the best by "max:<metric>" or "min:<metric>" (e.g. "min:eval_loss").
  int64_t save_every = 0;
  bool save_last = true;
  int keep_last = 3;
  std::string save_best_by{};
  // Checkpoint files written by a thread from host copies while the steps go on
  // (train/background_checkpoints.h); nullopt: for a state on a GPU whose host copy fits in half
  // the available memory (on the CPU the copy would add the state to the peak).
  std::optional<bool> background_checkpoints{};
  // Continue from the newest checkpoint in the workdir, exactly where it stopped.
  bool resume = false;
  nlohmann::json checkpoint_extra = nlohmann::json::object();  // stored in each checkpoint's meta.json
  bool progress = true;  // progress bar, metrics.jsonl and TensorBoard events (rank 0)
  // Where the output is not a terminal: a progress line every this many steps (0: every 10 %).
  int64_t progress_every = 0;
  // Logged with each step: the learning rate of a step, and tokens per example (for tokens/s).
  std::function<double(int64_t step)> learning_rate{};
  int64_t tokens_per_example = 0;
  // After each optimizer step, on every rank (collectives are allowed): e.g. sampling text.
  std::function<void(int64_t step, const Params& params)> on_step{};
  // At each epoch's end, rank 0 prints "epoch N | train loss L | <eval metrics>".
  bool epoch_summary = true;
  // Log each step's model FLOPs per second (GEMMs counted as they run, summed over ranks
  // assuming they are balanced) and MFU against the GEMM peak: peak_gflops, or when 0 this
  // machine's measured peak for the matmul precision in use (train/gemm_peak.h).
  bool log_mfu = false;
  double peak_gflops = 0;
  // "START:END": profile those optimizer steps (from 1, inclusive) into <workdir>/profile
  // (trace.json, ops.txt, ops.json; see profiler.h). Empty: off.
  std::string profile_steps{};
  // Run one step on the first batch, print its memory per rank (train/step_memory.h) and
  // throw DryRunDone: nothing is logged or saved.
  bool dry_run = false;
  // Read the steps' losses (with their metrics and deferred index checks) every this many
  // steps, all in one copy, instead of after each step: on a GPU the host then queues steps
  // back to back without waiting for each to finish. Steps are logged when read; evaluation,
  // checkpoints, on_step, an epoch's end and a stop read the pending ones first. 0: every 16
  // steps on a GPU, every step on the CPU (where a read waits for nothing).
  int64_t read_loss_every = 0;
  // The default step captured as a CUDA graph per batch shape after warm-up and replayed
  // (train/captured_steps.h): automatic on a GPU says why when it cannot and goes on eagerly;
  // on stops with the reason; off never captures. Nothing to capture on the CPU. The same
  // for the eval step (train/captured_forward.h).
  CudaGraphs cuda_graphs = CudaGraphs::automatic;
  // How the default step scales the loss where the precision policy asks for it (f16): the
  // scale, its growth and whether it changes at all. Unused under other precisions.
  optim::LossScaleOptions loss_scale{};
};

// Thrown by Trainer::fit after a dry run's step (FitOptions::dry_run); what() is the line
// rank 0 printed.
class DryRunDone : public std::runtime_error {
 public:
  explicit DryRunDone(const std::string& what) : std::runtime_error(what) {}
};

// How many optimizer steps fit will run: an epoch is the full global batches of the dataset
// (per-device batch x data ranks) divided into steps of grad_accum_steps micro-batches, and
// max_steps (when >= 0) caps the total. Learning-rate schedules are built from total_steps.
struct StepPlan {
  int64_t batches_per_epoch = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
};
// Throws naming the sizes when an epoch makes no step.
StepPlan plan_steps(int64_t dataset_size, const FitOptions& options, const Deployer& deployer);

struct EpochSummary {
  int64_t epoch = 0;  // 1-based
  int64_t step = 0;
  double train_loss = 0;  // mean over the epoch's steps, those before a resume included
  std::map<std::string, double> eval;
};

struct FitResult {
  std::vector<double> losses;  // per optimizer step, this run's steps only
  std::vector<std::map<std::string, double>> evals;
  std::vector<EpochSummary> epochs;
  int64_t steps = 0;  // optimizer steps completed, including resumed ones
};

class Trainer {
 public:
  template <class Loss>
  Trainer(Deployer& deployer, CollateFn collate, Loss loss, Params params, optim::Transform optimizer,
          std::optional<ShardingPlan> plan = std::nullopt)
      : Trainer(deployer, std::move(collate), to_loss_fn(std::move(loss)), std::move(params), std::move(optimizer),
                std::move(plan), 0) {}

  // Whether default steps are captured as CUDA graphs (FitOptions::cuda_graphs; fit sets it).
  void set_cuda_graphs(CudaGraphs mode);
  // Steps replayed from a captured graph so far.
  int64_t captured_step_replays() const { return captured_ ? captured_->replays() : 0; }
  // Eval batches replayed from a captured graph so far.
  int64_t captured_eval_replays() const { return captured_eval_ ? captured_eval_->replays() : 0; }
  // The loss scaling of default steps under a policy that needs it (FitOptions::loss_scale; fit
  // sets it). A scale restored from a checkpoint is kept.
  void set_loss_scale(const optim::LossScaleOptions& options);
  // The scaler of the default steps (null until a step ran under a loss-scaled precision or a
  // checkpoint restored one): its scale, growth tracker and skipped steps.
  const optim::LossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  // Batch fields the collate pads only to its own slice's longest row (batch_shapes.h): with
  // several data ranks they are padded to the ranks' longest before each step.
  void set_padded_fields(std::vector<PaddedFields> groups) { padded_fields_ = std::move(groups); }
  // Replaces the default optimizer step (see TrainStepFn).
  void set_train_step(TrainStepFn step) { custom_step_ = std::move(step); }
  // Runs `rollout` on each step's micro-batches first (see RolloutFn).
  void set_rollout(RolloutFn rollout) { rollout_ = std::move(rollout); }
  // One optimizer step on these micro-batches (global arrays, e.g. from Deployer::shard_batch);
  // returns the mean loss. fit calls it for every step.
  double train(const std::vector<Batch>& micro_batches);

  FitResult fit(std::shared_ptr<const data::Dataset> train, const FitOptions& options);
  // The mean loss over every example of a dataset, on any number of processes: batch means
  // weighted by their rows; the rows after the last whole global batch run as one batch on
  // every rank. No dropout.
  double eval_loss(std::shared_ptr<const data::Dataset> data, int64_t per_device_batch_size);
  // eval_loss under "eval_loss" and the means of the metrics the loss function records
  // (step_metrics.h) under "eval_<name>", weighted like the loss.
  std::map<std::string, double> eval_metrics(std::shared_ptr<const data::Dataset> data, int64_t per_device_batch_size);
  // The metrics the loss function recorded in the last step (means over its micro-batches).
  const std::map<std::string, double>& last_step_metrics() const { return step_metrics_; }
  // Host reads inside the last step, between its batches and its loss read (0 is the goal:
  // logged as host_reads in metrics.jsonl).
  uint64_t last_step_host_reads() const { return step_host_reads_; }
  // Arrays made from host values in the last default step after its batch (core/host_reads.h;
  // logged as host_uploads): 0 after warm-up, as a captured step needs.
  uint64_t last_step_host_uploads() const { return step_host_uploads_; }

  // Prints on rank 0; during fit above the progress bar and after the metrics already
  // pushed, so text from an on_step hook does not tear the bar.
  void print(const std::string& text);

  const Params& params() const { return params_; }
  const Params& opt_state() const { return opt_state_; }
  // Frees the optimizer state once training is over (the last checkpoint holds it), so that
  // what comes after — an exported model gathered from its shards, generation — has its
  // memory. Training or checkpointing again afterwards is refused.
  void release_optimizer_state();
  int64_t step() const { return step_; }
  const ShardingPlan* plan() const { return plan_ ? &*plan_ : nullptr; }
  const Deployer& deployer() const { return deployer_; }

 private:
  Trainer(Deployer& deployer, CollateFn collate, LossFn loss, Params params, optim::Transform optimizer,
          std::optional<ShardingPlan> plan, int);
  // A step whose updates are enqueued and whose results are not yet read: its loss per
  // micro-batch, the metrics its loss recorded and its deferred index checks stay where the
  // step left them until read_step.
  struct PendingStep {
    int64_t step = 0;  // its number (from 1)
    std::vector<Array> losses;
    MetricMeans metrics;
    std::vector<PendingCheck> checks;
    uint64_t host_reads = 0, host_uploads = 0;
    std::optional<double> read_loss;  // a custom step's loss, read by the step itself
    std::map<std::string, double> read_metrics;
  };
  PendingStep enqueue_step(const std::vector<Batch>& micro_batches);
  PendingStep enqueue_default_step(const std::vector<Batch>& micro_batches, const RngKey& key);
  // The default step itself (value_and_grad over each micro-batch, the mean gradient, the
  // update) with step_key_: run eagerly, or recorded by captured_.
  StepResults run_default_step(const std::vector<Batch>& micro_batches);
  // Why this trainer's default steps cannot be captured ("" when they can).
  std::string why_steps_cannot_be_captured() const;
  // Why its eval steps cannot be ("" when they can): the parameters' and processes' reasons.
  std::string why_forward_cannot_be_captured() const;
  // graphs_mode_ for this run: automatic is off on the CPU (nothing to capture there).
  CudaGraphs effective_graphs_mode() const;
  // The eval step's graphs, made at the first evaluation.
  CapturedForward& captured_eval();
  // The default step's key: the run's step key with the step number folded in last from
  // step_fold_, which the host rewrites before each step. The step's launches then carry the
  // same arguments every step (a captured CUDA graph replays them) and still draw new masks.
  RngKey device_step_key();
  // Reads the pending steps' losses in one copy and their checks in one more; returns each
  // step's mean loss, in order, with its metrics and host reads left in step_metrics_ and
  // step_host_reads_ by the callback `each(i, loss)` before the next is read. A failed check
  // marks the trainer broken and throws.
  void read_steps(std::vector<PendingStep>& steps, const std::function<void(size_t, double)>& each);

  // The current epoch's losses so far; checkpoints carry them so that the epoch's train loss
  // after a resume covers the steps run before the interruption too.
  struct EpochProgress {
    double loss_sum = 0;
    int64_t steps = 0;
  };
  // What a checkpoint restores beyond parameters and optimizer state.
  struct ResumeState {
    std::string checkpoint;                   // its directory
    nlohmann::json data;                      // the data loader's position (null if none)
    EpochProgress epoch;
  };
  enum class CheckpointKind { step, best };

  // The sampler of this process's share of each global batch.
  data::SamplerOptions sampler_options(int64_t per_device_batch_size, bool shuffle, int64_t epochs) const;
  void save_checkpoint(CheckpointKind kind, const nlohmann::json& data_state, const EpochProgress& epoch,
                       const FitOptions& o, const BestMetric* best = nullptr, double value = 0);
  // Restores the newest checkpoint (after checking it belongs to this model), laying every
  // array out like the live parameters and optimizer state; nullopt when there is none.
  std::optional<ResumeState> restore_latest(const nlohmann::json& expected_extra);
  // fit's pieces: the resume, the metric sinks, one step's log record, an epoch's line, the
  // final summary.
  EpochProgress resume_into(data::DataLoader<Batch>& loader, const FitOptions& o);
  [[noreturn]] void dry_run_step(data::DataLoader<Batch>& loader, const FitOptions& o);
  std::vector<std::shared_ptr<MetricSink>> open_metric_sinks(const FitOptions& o, int64_t total_steps);
  std::map<std::string, MetricValue> step_record(double loss, double lr, double seconds, double model_flops,
                                                 double peak_gflops, const FitOptions& o) const;
  void print_epoch(const EpochSummary& summary);
  // Redraws <workdir>/curves.svg from metrics.jsonl (rank 0, after the writer caught up).
  void refresh_curves(AsyncMetricWriter& writer);
  void print_fit_summary(const FitResult& result, double seconds, double training_seconds, const FitOptions& o);

  Deployer& deployer_;
  CollateFn collate_;
  LossFn loss_;
  Params params_;
  optim::Transform optimizer_;
  Params opt_state_;
  bool opt_state_released_ = false;
  // Set when a step's deferred check failed after its update was applied: the parameters are
  // no longer those of any step, so the trainer neither trains nor saves again.
  std::string broken_;
  // The checkpoint writer of the fit in progress (null outside fit).
  std::unique_ptr<BackgroundCheckpoints> checkpoints_;
  std::optional<ShardingPlan> plan_;
  TrainStepFn custom_step_;
  std::vector<PaddedFields> padded_fields_;
  RolloutFn rollout_;
  ProgressBar* active_bar_ = nullptr;  // set while fit runs
  AsyncMetricWriter* active_writer_ = nullptr;
  int64_t step_ = 0;
  Array step_fold_;  // i64 scalar on the device: step_ while a default step runs
  RngKey step_key_;  // the default step's key, read by run_default_step
  CudaGraphs graphs_mode_ = CudaGraphs::automatic;
  std::unique_ptr<CapturedSteps> captured_;  // made at the first default step
  std::unique_ptr<CapturedForward> captured_eval_;
  std::map<std::string, double> step_metrics_;  // recorded by the loss in the last step
  optim::LossScaleOptions loss_scale_options_;
  std::string captured_policy_;  // the precision policy captured_'s graphs were recorded under
  bool custom_step_warned_ = false;
  std::optional<optim::LossScaler> scaler_;  // made by loss_scaler_for_steps when first needed
  optim::LossScaler& loss_scaler_for_steps();
  // Reads of array values to the host (core/host_reads.h) in the last default step between
  // its batch and its loss read: each one a wait for the device on a GPU (issue 45).
  uint64_t step_host_reads_ = 0;
  uint64_t step_host_uploads_ = 0;
};

}  // namespace mt::train
