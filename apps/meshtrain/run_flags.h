#pragma once
// Flags every training and inference command shares: where it runs (--mesh or
// --model-shards), its seed, its output directory, --print-plan and --resume.
#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/meshtrain/flag_checks.h"

#include "meshtrain/models/pretrained.h"
#include "meshtrain/autodiff/precision_policy.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/train/deployer.h"
#include "meshtrain/train/stop_signal.h"
#include "meshtrain/train/trainer.h"

namespace mt::cli {

struct RunFlags {
  std::string mesh;        // "data=2,model=2"; empty: data = world / model_shards
  int model_shards = 1;
  uint64_t seed = 0;
  std::string output_dir;
  bool print_plan = false;
  bool dry_run = false;    // print the plan and the state per rank, measure one step, exit
  bool reschedule = false;  // --resume with another --steps: stretch the schedule to the new total
  int64_t logging_steps = 0;  // not on a terminal: a progress line every N steps (0: every 10 %)
  int64_t read_loss_every = 0;  // read the losses every N steps in one copy (0: 16 on a GPU, 1 on the CPU)
  bool fsdp = false;       // shard large weights over the data axis too
  std::string grad_reduce_dtype = "f32";  // data-parallel gradients on the wire: f32 or bf16 (dist::grad_reduce_dtype)
  bool resume = false;
  bool overwrite = false;
  std::string precision = "f32";  // f32, tf32, bf16, f16 or bf16-matmul (see mt::PrecisionPolicy)
  std::string loss_scale = "dynamic";  // f16's loss scale: dynamic or a fixed number (optim/loss_scale.h)
  int64_t loss_scale_window = optim::LossScaleOptions{}.growth_interval;  // finite steps before a dynamic scale grows
  std::string save_dtype = "f32";  // the exported model folder's dtype: f32, bf16 or f16
  std::string profile;            // "START:END" optimizer steps to profile (train/profiler.h)
  double peak_gflops = 0;         // MFU's roof; 0: measured (train/gemm_peak.h)
  std::string remat = "none";     // what the backward pass recomputes: none, block or full (autodiff/remat.h)
  std::string device = "auto";    // auto, cpu, cuda, cuda:N (core/device.h)
  std::string attention = "auto";  // auto, composed or fused (mt::AttentionKernel)
  std::string checkpoint_writes = "auto";  // auto, background or foreground (train/background_checkpoints.h)
  std::string cuda_graphs = "auto";  // auto, on or off (train/captured_steps.h)
};

void add_run_flags(CLI::App* cmd, RunFlags& flags, bool training);
// --device auto|cpu|cuda[:N] (part of the run flags; generate takes it alone).
void add_device_flag(CLI::App* cmd, std::string& device);
// --precision f32|tf32|bf16|f16|bf16-matmul (part of the run flags; generate takes it alone).
void add_precision_flag(CLI::App* cmd, std::string& precision);
// --allow-new-heads: parameters a model checkpoint lacks are initialized (and reported)
// instead of refused.
void add_allow_new_heads_flag(CLI::App* cmd, bool& allow);

// How long a training command runs: --steps or --epochs, --per-device-batch-size and
// --grad-accum (each command sets its own defaults before adding them).
struct StepFlags {
  int64_t steps = 0;  // 0: run `epochs`
  int64_t epochs = 1;
  int64_t per_device_batch_size = 8;
  int grad_accum = 1;
};
void add_step_flags(CLI::App* cmd, StepFlags& flags);
// Fills f's batch, accumulation and length from the flags (--steps runs as many epochs as it
// needs) and returns the total optimizer steps, which learning-rate schedules span.
int64_t plan_fit(const StepFlags& flags, int64_t train_size, const train::Deployer& deployer, train::FitOptions& f);

// "" when `text` is a --loss-scale value (dynamic or a positive number), else why not.
std::string loss_scale_error(const std::string& text);
// The run flags' part of a fit: --resume, --profile, MFU logging against --peak-gflops.
void apply_run_flags(const RunFlags& flags, train::FitOptions& f);


train::Deployer make_deployer(const RunFlags& flags);

// `asked` (what `flag` sets) capped at the `positions` the model read from `source` has (0: no
// bound), with a line saying so, as run_glue and TRL cap their lengths at the model's: longer
// sequences would stop the run at its first long batch (the model refuses them).
int64_t length_within_positions(int64_t asked, int64_t positions, const std::string& flag, const std::string& source,
                                const train::Deployer& deployer, const std::string& command);

// The start-up line naming the CPU path, e.g. "meshtrain: cpu: avx2, bf16 emulated (widened
// to f32)" (rank 0, stderr).
void print_cpu_line();

// The command's precision policy (mt::PrecisionPolicy); hold it for the whole command: `auto scope = precision_scope(flags.precision);`.
// Also prints the start-up line (print_cpu_line), and says when bf16 is emulated.
std::unique_ptr<PrecisionScope> precision_scope(const std::string& precision);

// --max-grad-norm: clipping to that global norm, or none for 0 (Hugging Face's convention);
// either way a stateless first transform, so checkpoints keep the same state paths.
optim::Transform gradient_clipping(double max_grad_norm);
// Adds --max-grad-norm (>= 0) bound to `value`.
void add_max_grad_norm_flag(CLI::App* cmd, double& value);

// The model as --remat asks it to train (its config's recomputation policy).
void apply_remat(const RunFlags& flags, models::PretrainedModel& model);

// The automatic sharding plan (printed as a table on rank 0 with --print-plan).
train::ShardingPlan make_plan(const train::Deployer& deployer, const Params& params, const models::ParamRoles& roles,
                              const RunFlags& flags);

// The steps a learning-rate schedule spans: the run's `total`, or under --resume the span the
// resumed run was planned with (its checkpoints record it as "schedule_steps"), so changing
// --steps extends or cuts the run without bending its schedule; the change is printed.
int64_t schedule_steps(const RunFlags& flags, int64_t total);
// Warmup steps that fit a run of `total` steps (always below it): `warmup` when below it, else
// a tenth of the run (HF's warmup_ratio 0.1), with a note, so a short run does not end at its
// peak rate.
int64_t fitting_warmup(int64_t warmup, int64_t total, const char* command);

// The trained parameters gathered whole, for the export: a collective every rank calls, but
// only the main rank (which writes the files) keeps them; the others drop each tensor once
// gathered (returning none), so their peak does not grow by a whole model at the end.
Params gathered_params(const train::Trainer& trainer, const train::Deployer& deployer);

// The trained model as a Hugging Face folder in `dir`, written by the main rank; a collective
// every rank calls. Each parameter is gathered, converted and written in turn, so no process
// holds a whole copy of the model beside its shards (GPT-2 Large under --fsdp: rank 0 peaked
// 0.3 GB above its training steps while it held one). A LoRA model is merged from
// model.params, which gathered_params must have filled (the merge needs a layer's factors
// together).
void export_model(const train::Trainer& trainer, const train::Deployer& deployer, const models::PretrainedModel& model,
                  const std::string& dir, DType dtype);

// The optimizer of the commands that train with warmup and cosine decay (seq2seq, caption,
// image-classify): AdamW after gradient clipping, with --learning-rate, --warmup-steps,
// --weight-decay and --max-grad-norm.
struct AdamWFlags {
  double learning_rate = 5e-4;
  int64_t warmup_steps = 10;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
};
void add_adamw_flags(CLI::App* cmd, AdamWFlags& flags);
// The schedule (linear warmup from 0, fitted to `span` as fitting_warmup does, then cosine to
// 10 % of the peak at `span`) and AdamW on it. `wrap` takes AdamW before the clipping is
// chained in front (LoRA's partition: lora_optimizer).
struct WarmupCosineAdamW {
  optim::Schedule learning_rate;
  optim::Transform optimizer;  // clipping, then (wrapped) AdamW
};
WarmupCosineAdamW warmup_cosine_adamw(const AdamWFlags& flags, int64_t span, const char* command,
                                      const std::function<optim::Transform(optim::Transform)>& wrap = nullptr);

// Training refuses to start over checkpoints of an earlier run unless --resume continues it
// or --overwrite discards it: nothing saved is lost by accident. Call on every rank.
void check_output_dir(const RunFlags& flags, const char* command);

}  // namespace mt::cli
