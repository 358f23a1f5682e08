#include "meshtrain/train/trainer.h"

#include "meshtrain/train/batch_shapes.h"

#include <chrono>
#include <filesystem>
#include <iomanip>
#include <set>
#include <sstream>

#include "meshtrain/autodiff/precision_policy.h"
#include "meshtrain/autodiff/value_and_grad.h"
#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/host_reads.h"
#include "meshtrain/core/trace.h"
#include "meshtrain/data/data_loader.h"
#include "meshtrain/distributed/layout_tree.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/deferred_checks.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/train/async_metric_writer.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/curves_svg.h"
#include "meshtrain/train/gemm_peak.h"
#include "meshtrain/train/host_transfer_counters.h"
#include "meshtrain/train/jsonl_logger.h"
#include "meshtrain/train/memory_usage.h"
#include "meshtrain/train/profiler.h"
#include "meshtrain/train/step_memory.h"
#include "meshtrain/train/step_metrics.h"
#include "meshtrain/train/stop_signal.h"
#include "meshtrain/train/progress.h"
#include "meshtrain/train/tensorboard.h"

namespace mt::train {

namespace fs = std::filesystem;

// A batch the step reduces over the data axis: the ranks' slices must agree in shape first
// (those padded to their own longest row are padded to the ranks' longest).
static Batch checked_shard(const Deployer& deployer, const Batch& local, const std::vector<PaddedFields>& padded) {
  if (deployer.data_size() == 1) return local;
  const Batch agreed = padded.empty() ? local : pad_to_ranks_longest(local, padded, deployer.mesh().comm());
  check_same_batch_shapes(agreed, deployer.mesh().comm());
  return deployer.shard_batch(agreed);
}

namespace {
// The loss a step reports and differentiates is f32 whatever the compute dtype.
Array loss_in_f32(const Array& loss) { return cast(loss, DType::f32); }

// "n_layer: 2 → 3, lora.rank: 8 → (absent)": the keys whose values differ, checkpoint → now.
std::string config_differences(const nlohmann::json& saved, const nlohmann::json& now, const std::string& prefix = "") {
  using json = nlohmann::json;
  std::vector<std::string> parts;
  std::set<std::string> keys;
  if (saved.is_object())
    for (const auto& [k, v] : saved.items()) keys.insert(k);
  if (now.is_object())
    for (const auto& [k, v] : now.items()) keys.insert(k);
  for (const std::string& k : keys) {
    const json a = saved.is_object() && saved.contains(k) ? saved[k] : json(), b = now.is_object() && now.contains(k) ? now[k] : json();
    if (a == b) continue;
    if (a.is_object() && b.is_object()) {
      parts.push_back(config_differences(a, b, prefix + k + "."));
      continue;
    }
    parts.push_back(prefix + k + ": " + (a.is_null() ? "(absent)" : a.dump()) + " \u2192 " +
                    (b.is_null() ? "(absent)" : b.dump()));
  }
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

// Whether any rank was asked to stop (train/stop_signal.h): one small all-reduce a step under
// mpirun, so that every rank stops after the same step; nothing at all where no command armed
// the stop (the library used on its own).
bool stop_agreed() {
  if (!stop_armed()) return false;
  int32_t stop = stop_requested() ? 1 : 0;
  dist::Communicator& world = dist::world();
  if (world.size() > 1) world.all_reduce(&stop, 1, DType::i32, dist::ReduceOp::max);
  return stop != 0;
}
}  // namespace
using json = nlohmann::json;

Trainer::Trainer(Deployer& deployer, CollateFn collate, LossFn loss, Params params, optim::Transform optimizer,
                 std::optional<ShardingPlan> plan, int)
    : deployer_(deployer), collate_(std::move(collate)), loss_(std::move(loss)), optimizer_(std::move(optimizer)),
      plan_(std::move(plan)) {
  MT_CHECK(collate_ && loss_, "[trainer] collate and loss functions are required");
  // Parameters take the plan's layout; optimizer slots follow them (zeros_like). Each whole
  // parameter a plan shards is dropped once its block exists (when the caller moved them in):
  // the whole model never sits beside its shards, and the moments are allocated beside the
  // shards alone.
  if (plan_) {
    params_ = plan_->shard(std::move(params));
    // Their pages go back to the OS: the freed range is cut up between the shards' later
    // allocations and would otherwise stay resident as holes (GPT-2 Large over 2 ranks:
    // 3 GB per rank before the first step).
    CachingAllocator::instance().release_cached();
  } else {
    params_ = std::move(params);
  }
  opt_state_ = optimizer_.init(params_);
}

StepPlan plan_steps(int64_t dataset_size, const FitOptions& o, const Deployer& deployer) {
  MT_CHECK(o.per_device_batch_size > 0 && o.grad_accum_steps > 0, "[trainer] batch size and accumulation must be positive");
  StepPlan plan;
  const int64_t global_batch = o.per_device_batch_size * deployer.data_size();
  plan.batches_per_epoch = dataset_size / global_batch;
  MT_CHECK(plan.batches_per_epoch > 0, "[trainer] ", dataset_size, " training examples make no global batch of ",
           global_batch);
  plan.steps_per_epoch = plan.batches_per_epoch / o.grad_accum_steps;
  MT_CHECK(plan.steps_per_epoch > 0, "[trainer] an epoch of ", plan.batches_per_epoch, " batches makes no step of ",
           o.grad_accum_steps, " accumulated micro-batches");
  plan.total_steps = plan.steps_per_epoch * o.epochs;
  if (o.max_steps >= 0) plan.total_steps = std::min(plan.total_steps, o.max_steps);
  return plan;
}

void Trainer::release_optimizer_state() {
  captured_.reset();  // its graphs' memory too: nothing trains afterwards
  captured_eval_.reset();  // an evaluation after this captures anew
  opt_state_ = Params{};
  opt_state_released_ = true;
}

double Trainer::train(const std::vector<Batch>& micro_batches) {
  std::vector<PendingStep> steps;
  steps.push_back(enqueue_step(micro_batches));
  double loss = 0;
  read_steps(steps, [&](size_t, double l) { loss = l; });
  return loss;
}

Trainer::PendingStep Trainer::enqueue_step(const std::vector<Batch>& micro_batches) {
  MT_CHECK(!micro_batches.empty(), "[trainer] a step needs at least one micro-batch");
  MT_CHECK(!opt_state_released_, "[trainer] cannot train: the optimizer state was released (release_optimizer_state)");
  MT_CHECK(broken_.empty(), "[trainer] cannot train: ", broken_);
  std::vector<Batch> rolled;
  if (rollout_) {
    trace::Span span("phase", "rollout");
    // Sampling draws on the host: its key has the step folded in there.
    rolled = rollout_(params_, micro_batches, step_, deployer_.step_key(step_).fold_in(0x7011));
    MT_CHECK(!rolled.empty(), "[trainer] the rollout returned no batch");
  }
  const std::vector<Batch>& batches = rollout_ ? rolled : micro_batches;
  const RngKey key = device_step_key();
  PendingStep pending;
  if (custom_step_) {
    if (precision_policy().loss_scaling && !custom_step_warned_) {
      custom_step_warned_ = true;
      print("note: a custom train step scales no loss under --precision " + precision_policy().name +
            " (optim::LossScaler is there for it to use)");
    }
    trace::Span span("phase", "custom_step");
    // A custom step records its metrics as it means them (its own averaging).
    MetricRecorder recorder;
    pending.read_loss = custom_step_(params_, opt_state_, batches, key);
    MetricMeans means;
    means.add(recorder.take(), 1.0);
    pending.read_metrics = means.read();
  } else {
    pending = enqueue_default_step(batches, key);
  }
  pending.step = ++step_;
  return pending;
}

RngKey Trainer::device_step_key() {
  if (!step_fold_.defined()) step_fold_ = Array::zeros({}, DType::i64, current_device());
  // Ordered after the kernels already enqueued, which read the previous step's number.
  const int64_t step = step_;
  step_fold_.write_from_host(&step);
  return deployer_.step_key_root().folding_last(step_fold_);
}

void Trainer::read_steps(std::vector<PendingStep>& steps, const std::function<void(size_t, double)>& each) {
  // Every pending loss in one copy (and every check in one more): one wait for the device per
  // read, however many steps it covers.
  std::vector<Array> losses;
  std::vector<PendingCheck> checks;
  for (PendingStep& s : steps) {
    losses.insert(losses.end(), s.losses.begin(), s.losses.end());
    for (PendingCheck& c : s.checks) checks.push_back(std::move(c));
    s.checks.clear();
  }
  std::vector<double> values;
  if (!losses.empty()) {
    const Array all = losses.size() == 1 ? losses.front() : stack(losses, 0);
    values = all.to_doubles();
  }
  try {
    read_checks(std::move(checks));
  } catch (const Error& e) {
    const int64_t first = steps.front().step, last = steps.back().step;
    const bool one = first == last;
    const std::string named = one ? detail::concat("step ", first) : detail::concat("steps ", first, "-", last);
    const std::string applied = detail::concat(one ? "its update was" : "their updates were",
                                               " applied; nothing was saved from ", one ? "it" : "them");
    // A verdict that cannot be true is no fault of the data: the message does not blame it.
    if (dynamic_cast<const VerdictMisfire*>(&e))
      broken_ = detail::concat(named, ": ", e.what(), "; ", applied, " — resume from the last checkpoint");
    else
      broken_ = detail::concat(named, " read an invalid input (", e.what(), ") after ", applied,
                               " — fix the data and resume from the last checkpoint");
    // The unread steps are not counted (their updates were applied: the trainer is broken).
    step_ = first - 1;
    throw Error(detail::concat("[trainer] ", broken_));
  }
  size_t next = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    PendingStep& s = steps[i];
    double loss;
    if (s.read_loss) {
      loss = *s.read_loss;
      step_metrics_ = std::move(s.read_metrics);
    } else {
      double total = 0;
      for (size_t m = 0; m < s.losses.size(); ++m) total += values[next++];
      loss = total / double(s.losses.size());
      step_metrics_ = s.metrics.read();
    }
    step_host_reads_ = s.host_reads;
    step_host_uploads_ = s.host_uploads;
    each(i, loss);
  }
}

void Trainer::print(const std::string& text) {
  if (!deployer_.is_main()) return;
  if (active_writer_) active_writer_->flush();
  if (active_bar_) active_bar_->message(text);
  else deployer_.log(text);
}

std::string Trainer::why_forward_cannot_be_captured() const {
  return train::why_forward_cannot_be_captured(deployer_.mesh().comm().size(), params_);
}

std::string Trainer::why_steps_cannot_be_captured() const {
  const int processes = deployer_.mesh().comm().size();
  if (processes > 1)
    return detail::concat("the step's gradients are reduced across ", processes,
                          " processes (collectives are not captured)");
  if (precision_policy().loss_scaling)
    return "f16's loss scaling reads its overflow check on the host each step to skip or apply the update";
  if (!optim::capturable(optimizer_))
    return "the optimizer has a part without host_step (sgd's rate or multi_steps' branching are host values of "
           "each step)";
  return why_forward_cannot_be_captured();
}

void Trainer::set_loss_scale(const optim::LossScaleOptions& options) {
  optim::validate(options, "trainer loss scale");
  loss_scale_options_ = options;
  if (!scaler_) return;
  // A scale already running (restored from a checkpoint, or earlier steps) carries on under the
  // new settings.
  const nlohmann::json state = scaler_->state();
  scaler_.emplace(options);
  scaler_->load_state(state);
}

optim::LossScaler& Trainer::loss_scaler_for_steps() {
  if (!scaler_) scaler_.emplace(loss_scale_options_);
  return *scaler_;
}

void Trainer::set_cuda_graphs(CudaGraphs mode) {
  if (mode != graphs_mode_) {
    captured_.reset();
    captured_eval_.reset();
  }
  graphs_mode_ = mode;
}

CudaGraphs Trainer::effective_graphs_mode() const { return graphs_mode_for(graphs_mode_, params_); }

CapturedForward& Trainer::captured_eval() {
  if (!captured_eval_) {
    captured_eval_ = std::make_unique<CapturedForward>(effective_graphs_mode(), "the eval step",
                                                       [this](const std::string& line) { print(line); });
    captured_eval_->refuse_all(why_forward_cannot_be_captured());
  }
  return *captured_eval_;
}

Trainer::PendingStep Trainer::enqueue_default_step(const std::vector<Batch>& micro_batches, const RngKey& key) {
  // A graph replays the launches of the precision policy it was recorded under (its casts, its
  // loss scaling or none): under another policy the step is recorded anew, or refused.
  if (captured_ && captured_policy_ != precision_policy().name) {
    captured_.reset();
    captured_eval_.reset();
  }
  if (!captured_) {
    captured_policy_ = precision_policy().name;
    captured_ = std::make_unique<CapturedSteps>(
        effective_graphs_mode(), params_, opt_state_, optimizer_,
        [this](const std::vector<Batch>& b) { return run_default_step(b); },
        [this](const std::string& line) { print(line); });
    captured_->refuse_all(why_steps_cannot_be_captured());
  }
  step_key_ = key;
  StepResults r;
  try {
    r = captured_->run(micro_batches, step_ + 1);
  } catch (const Error&) {
    if (!captured_->broken().empty()) broken_ = captured_->broken();
    throw;
  }
  PendingStep pending;
  pending.host_reads = r.host_reads;
  pending.host_uploads = r.host_uploads;
  pending.losses = std::move(r.losses);
  pending.metrics = std::move(r.metrics);
  pending.checks = std::move(r.checks);
  return pending;
}

StepResults Trainer::run_default_step(const std::vector<Batch>& micro_batches) {
  const RngKey& key = step_key_;
  const uint64_t reads_at_start = host_read_count(), uploads_at_start = host_upload_count();
  // Index checks (token ids, labels) record their verdicts on the device; they are read with
  // the loss, so the step does not wait for the device midway.
  DeferredChecks checks;
  Params grads;
  // The losses are read after the optimizer is enqueued: on a GPU the host then queues the
  // update while the backward pass still runs, instead of waiting for it first.
  std::vector<Array> losses;
  MetricMeans recorded;  // the loss function's metrics, each micro-batch weighted alike
  std::optional<trace::Span> span;
  if (trace::enabled()) span.emplace("phase", "forward_backward");
  // Frozen parameters enter the loss as constants: no gradient is computed for them.
  auto [trainable, frozen] = optim::split_frozen(optimizer_, params_);
  // Mixed precision: the parameters cast to the compute dtype once for every micro-step.
  const PrecisionPolicy& policy = precision_policy();
  Params compute = policy.cast_for_compute(trainable);
  frozen = policy.cast_for_compute(frozen);
  // f16: the loss is multiplied by the scale before each backward pass, so the gradients of
  // f16 activations stay inside f16's range; the unscaled loss is what is reported.
  optim::LossScaler* scaler = policy.loss_scaling ? &loss_scaler_for_steps() : nullptr;
  const double loss_scale = scaler ? scaler->scale() : 1.0;
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const Batch& batch = micro_batches[m];
    const RngKey micro_key = key.fold_in(m);
    // The last micro-step takes the casts over: the tape then holds the only handles, and
    // each is freed once the backward pass has used it last instead of at the step's end
    // (GPT-2 Large under bf16: the whole 1.5 GB copy no longer sits beside the gradients).
    const bool last = m + 1 == micro_batches.size();
    Array unscaled_loss;  // detached: holding it keeps no activation alive in the backward pass
    auto loss_of_trainable = [&](const Params& master) {
      const Params p = last ? policy.compute_view(master, std::move(compute)) : policy.compute_view(master, compute);
      // Open only around the forward call: recomputation in the backward pass (remat) does
      // not record twice.
      MetricRecorder recorder;
      Array loss;
      if (frozen.empty()) {
        loss = loss_in_f32(loss_(p, batch, micro_key, true));
      } else {
        Params all = frozen;
        for (const auto& [path, v] : p) all.set(path, v);
        loss = loss_in_f32(loss_(all, batch, micro_key, true));
      }
      recorded.add(recorder.take(), 1.0);
      if (!scaler) return loss;
      unscaled_loss = loss.detach();
      return mul(loss, scalar_like(loss, loss_scale));
    };
    auto [loss, g] = value_and_grad(loss_of_trainable)(trainable);
    losses.push_back(dist::to_host(scaler ? unscaled_loss : loss).detach());
    if (grads.empty()) {
      grads = std::move(g);
    } else {
      for (auto& [path, acc] : grads) acc = add_in_place(std::move(acc), g[path]);
    }
  }
  // The bf16 copies and the extra handles on the parameters are dropped before the update: a
  // lower peak, and the parameters stay sole-owned, so the update rewrites them in place.
  compute = frozen = trainable = Params{};
  bool finite = true;
  if (scaler) {
    // Divided by the scale and the micro-batch count in one pass; an overflow anywhere skips
    // the update (parameters and optimizer state as they were) and shrinks the scale.
    finite = scaler->unscale(grads, double(micro_batches.size()));
    scaler->update(finite);
    recorded.add({{"loss_scale", Array::scalar(loss_scale)}}, 1.0);
    if (!finite)
      print(detail::concat("step ", step_ + 1, ": gradients overflowed at loss scale ", loss_scale,
                           "; the update is skipped and the scale is now ", scaler->scale()));
  } else if (micro_batches.size() > 1) {
    for (auto& [path, acc] : grads) acc = div(acc, double(micro_batches.size()));
  }
  span.reset();
  if (finite) {
    if (trace::enabled()) span.emplace("phase", "optimizer");
    // Moved in: a transform may rewrite the gradients in place (clipping scales them there).
    Params updates = optimizer_.update(std::move(grads), opt_state_, params_);
    grads = Params{};  // freed before the update is applied: a lower peak
    // Moved: when the trainer holds the only handles, the parameters are updated in place.
    params_ = optim::apply_updates(std::move(params_), updates);
  }
  grads = Params{};
  StepResults r;
  r.host_reads = host_read_count() - reads_at_start;
  r.host_uploads = host_upload_count() - uploads_at_start;
  r.losses = std::move(losses);
  r.metrics = std::move(recorded);
  r.checks = checks.take();
  return r;
}

data::SamplerOptions Trainer::sampler_options(int64_t per_device_batch_size, bool shuffle, int64_t epochs) const {
  data::SamplerOptions so;
  so.seed = deployer_.options().seed;
  so.shuffle = shuffle;
  so.drop_remainder = true;
  so.num_epochs = epochs;
  so.batch_size = per_device_batch_size * deployer_.data_size();
  so.process_index = deployer_.data_index();
  so.process_count = deployer_.data_size();
  return so;
}

double Trainer::eval_loss(std::shared_ptr<const data::Dataset> dataset, int64_t per_device_batch_size) {
  return eval_metrics(std::move(dataset), per_device_batch_size).at("eval_loss");
}

std::map<std::string, double> Trainer::eval_metrics(std::shared_ptr<const data::Dataset> dataset,
                                                    int64_t per_device_batch_size) {
  MT_CHECK(dataset != nullptr, "[trainer] eval_loss needs a dataset");
  MT_CHECK(dataset->size() > 0, "[trainer] the eval set is empty");
  trace::Span span("phase", "eval_loss");
  const data::SamplerOptions so = sampler_options(per_device_batch_size, false, 1);
  const int64_t n = dataset->size(), whole = n / so.batch_size * so.batch_size;
  // Every example counts, each with the same weight: the whole global batches run sharded
  // over the data axis as in training; the tail (fewer rows than a global batch, which cannot
  // be split evenly over the ranks) runs as one batch on every rank, replicated. Batch losses
  // are means, so they are weighted by their rows.
  // The sums of loss x rows stay on the device and are read once at the end, not once per
  // batch (each read a wait for the device); the sharded batches' and the tail's apart, as
  // they are laid out differently.
  Array sharded_sum, tail_sum;
  autodiff::NoGradGuard no_grad;
  DeferredChecks checks;  // read with the sums, at the end
  const Params compute = precision_policy().cast_for_compute(params_);
  MetricMeans recorded;
  const RngKey key = deployer_.step_key(-1);
  // One batch's loss, metrics and checks: run eagerly, or as a captured graph on a GPU.
  auto forward = [&](const Batch& batch) {
    ForwardResults out;
    DeferredChecks batch_checks;
    MetricRecorder recorder;
    out.loss = loss_in_f32(loss_(compute, batch, key, false));
    out.metrics = recorder.take();
    out.checks = batch_checks.take();
    return out;
  };
  auto add_batch = [&](const Batch& batch, double rows, Array& sum) {
    ForwardResults r = captured_eval().run(batch, compute, forward);
    const Array weighted = mul(r.loss, rows);
    sum = sum.defined() ? add(sum, weighted) : weighted;
    recorded.add(r.metrics, rows);
    for (PendingCheck& c : r.checks) checks.record(std::move(c));
  };
  if (whole > 0) {
    data::DataLoader<Batch> loader(dataset, data::IndexSampler(n, so), collate_, 1);
    while (auto b = loader.next()) add_batch(checked_shard(deployer_, b->data, padded_fields_), double(so.batch_size), sharded_sum);
  }
  if (whole < n) {
    data::SamplerOptions tail = so;
    tail.batch_size = n - whole;
    tail.process_index = 0, tail.process_count = 1;  // every rank reads the whole tail
    auto rest = std::make_shared<data::SubsetDataset>(dataset, whole, n);
    data::DataLoader<Batch> loader(rest, data::IndexSampler(rest->size(), tail), collate_, 1);
    while (auto b = loader.next()) add_batch(b->data, double(n - whole), tail_sum);
  }
  double total = 0;
  for (const Array* sum : {&sharded_sum, &tail_sum})
    if (sum->defined()) total += dist::to_host(*sum).item();
  checks.read();
  std::map<std::string, double> metrics = recorded.read("eval_");
  metrics["eval_loss"] = total / double(n);
  return metrics;
}

void Trainer::save_checkpoint(CheckpointKind kind, const json& data_state, const EpochProgress& epoch,
                              const FitOptions& o, const BestMetric* best, double value) {
  trace::Span span("phase", "checkpoint");
  MT_CHECK(!opt_state_released_, "[trainer] cannot checkpoint: the optimizer state was released (release_optimizer_state)");
  MT_CHECK(broken_.empty(), "[trainer] cannot checkpoint: ", broken_);
  json meta = o.checkpoint_extra.is_object() ? o.checkpoint_extra : json::object();
  meta["epoch_progress"] = {{"loss_sum", epoch.loss_sum}, {"steps", epoch.steps}};
  meta["data"] = data_state;
  meta["seed"] = deployer_.options().seed;
  meta["mesh"] = deployer_.mesh().str();
  if (scaler_) meta["loss_scale"] = scaler_->state();
  CheckpointState state{step_, 0, params_, opt_state_, meta};
  CheckpointManager manager((fs::path(deployer_.workdir()) / "checkpoints").string(), o.keep_last);
  if (!checkpoints_) checkpoints_ = std::make_unique<BackgroundCheckpoints>(deployer_.mesh(), o.background_checkpoints);
  if (kind == CheckpointKind::best) checkpoints_->save_best(manager, state, *best, value);
  else checkpoints_->save(manager, state);
}

std::optional<Trainer::ResumeState> Trainer::restore_latest(const json& expected_extra) {
  CheckpointManager manager((fs::path(deployer_.workdir()) / "checkpoints").string());
  std::optional<std::string> latest = manager.latest();
  if (!latest) return std::nullopt;
  // Every saved array takes the layout of the live array at its path.
  const dist::LayoutTree param_layouts = dist::layout_tree(params_), state_layouts = dist::layout_tree(opt_state_);
  auto layout_for = [&](const std::string& group, const std::string& path) {
    const dist::LayoutTree& tree = group == "params" ? param_layouts : state_layouts;
    auto it = tree.find(path);
    return it == tree.end() ? dist::PartitionSpec{} : it->second;
  };
  // Read into the live parameters and optimizer state, tensor by tensor: no second copy of the
  // state at the resume, and Adam's moments stay views of their flat buffer (updated in place
  // from the first step on). A refused checkpoint may leave some of them overwritten.
  auto live = [&](const std::string& group, const std::string& path) {
    const Params& tree = group == "params" ? params_ : opt_state_;
    return tree.contains(path) ? tree[path] : Array();
  };
  CheckpointState state;
  try {
    state = CheckpointManager::restore(*latest, deployer_.mesh(), layout_for, live);
  } catch (const Error& e) {
    // An unreadable newest checkpoint (a disk filled, a copy cut short): say which one came
    // before it, so the run can go on from there instead of from the start.
    const std::vector<std::string> all = manager.all();
    const std::string before = all.size() > 1 ? all[all.size() - 2] : "";
    throw Error(detail::concat(e.what(), "\n[trainer] cannot resume from ", *latest,
                               before.empty() ? std::string("; no earlier checkpoint is kept")
                                              : "; to resume from the one before it (" + before + "), move " + *latest +
                                                    " out of the checkpoints folder"));
  }
  // The checkpoint must be this model's: same configuration (when both name one), same
  // parameters with the same shapes and dtypes.
  if (expected_extra.contains("model_config") && state.extra.contains("model_config"))
    MT_CHECK(state.extra["model_config"] == expected_extra["model_config"], "[trainer] cannot resume from ", *latest,
             ": its model config differs from this run's: ",
             config_differences(state.extra["model_config"], expected_extra["model_config"]),
             " (flags such as --seq-len or --config differ)");
  MT_CHECK(state.params.paths() == params_.paths(), "[trainer] checkpoint ", *latest,
           " holds different parameters than the model");
  for (const auto& [path, p] : params_)
    MT_CHECK(state.params[path].shape() == p.shape() && state.params[path].dtype() == p.dtype(), "[trainer] cannot resume from ",
             *latest, ": parameter '", path, "' is ", state.params[path].str(), " there and ", p.str(), " in this model");
  params_ = state.params;
  opt_state_ = state.opt_state;
  step_ = state.step;
  std::string scale_note;
  if (const json scale = state.extra.value("loss_scale", json()); !scale.is_null()) {
    optim::LossScaler& scaler = loss_scaler_for_steps();
    scaler.load_state(scale);
    scale_note = detail::concat(", loss scale ", scaler.scale(), " (", scaler.skipped_steps(), " steps skipped so far)");
  }
  deployer_.log("resumed from " + *latest + " at step " + std::to_string(step_) + scale_note);
  ResumeState resumed;
  resumed.checkpoint = *latest;
  resumed.data = state.extra.value("data", json());
  if (const json progress = state.extra.value("epoch_progress", json()); progress.is_object())
    resumed.epoch = {progress.value("loss_sum", 0.0), progress.value("steps", int64_t(0))};
  return resumed;
}

Trainer::EpochProgress Trainer::resume_into(data::DataLoader<Batch>& loader, const FitOptions& o) {
  std::optional<ResumeState> resumed = restore_latest(o.checkpoint_extra);
  if (!resumed || resumed->data.is_null()) return {};
  try {
    loader.restore(resumed->data.get<data::SamplerState>());
  } catch (const Error& e) {
    // The data position is tied to the global batch (per-device batch x data ranks), seed
    // and dataset: say which checkpoint and which settings have to match.
    throw Error(detail::concat("[trainer] cannot resume the data position of ", resumed->checkpoint, ": ", e.what(),
                               " (keep per-device batch size x data-parallel ranks, the seed and the dataset as "
                               "they were)"));
  }
  return resumed->epoch;
}

void Trainer::dry_run_step(data::DataLoader<Batch>& loader, const FitOptions& o) {
  std::vector<Batch> micro;
  for (int m = 0; m < o.grad_accum_steps; ++m) {
    std::optional<data::LoadedBatch<Batch>> b = loader.next();
    MT_CHECK(b.has_value(), "[trainer] the dry run found no batch to step on");
    micro.push_back(checked_shard(deployer_, b->data, padded_fields_));
  }
  double trained_elements = 0;
  for (const auto& [path, p] : params_)
    if (!optim::is_frozen(optimizer_, path)) trained_elements += double(dist::local_view(p).numel());
  // At a loss scale of 1: the measured step must apply its update, which an f16 overflow at
  // the real scale would skip (nothing of this step is kept).
  if (precision_policy().loss_scaling) scaler_.emplace(optim::LossScaleOptions{.init_scale = 1, .dynamic = false});
  const StepMemory m = max_over_ranks(measure_step_memory(params_, trained_elements, opt_state_, [&] { train(micro); }));
  const std::string line = "dry run: one step's memory per rank" +
                           std::string(dist::world().size() > 1 ? " (the largest over the ranks)" : "") + ": " +
                           m.describe() + "; nothing saved";
  print(line);
  throw DryRunDone(line);
}

std::vector<std::shared_ptr<MetricSink>> Trainer::open_metric_sinks(const FitOptions& o, int64_t total_steps) {
  std::vector<std::shared_ptr<MetricSink>> sinks;
  if (!o.progress || !deployer_.is_main()) return sinks;
  fs::create_directories(deployer_.workdir());
  ProgressOptions po;
  po.start_step = step_;
  po.print_every = o.progress_every;
  sinks.push_back(std::make_shared<ProgressBar>(total_steps, po));
  JsonlLoggerOptions jo;
  jo.resume_step = step_;
  sinks.push_back(std::make_shared<JsonlLogger>((fs::path(deployer_.workdir()) / "metrics.jsonl").string(), jo));
  sinks.push_back(std::make_shared<TensorBoardWriter>((fs::path(deployer_.workdir()) / "tensorboard").string()));
  return sinks;
}

std::map<std::string, MetricValue> Trainer::step_record(double loss, double lr, double seconds, double model_flops,
                                                        double peak_gflops, const FitOptions& o) const {
  const int64_t examples_per_step = o.per_device_batch_size * deployer_.data_size() * o.grad_accum_steps;
  std::map<std::string, MetricValue> logged{{"loss", loss}};
  for (const auto& [name, value] : step_metrics_) logged[name] = value;
  if (!custom_step_) {
    logged[kHostReadsMetric] = double(step_host_reads_);
    logged[kHostUploadsMetric] = double(step_host_uploads_);
  }
  if (o.learning_rate) logged["lr"] = lr;
  if (o.tokens_per_example > 0) logged["tokens_per_s"] = double(examples_per_step * o.tokens_per_example) / seconds;
  else logged["examples_per_s"] = double(examples_per_step) / seconds;
  if (peak_gflops > 0) {
    logged["model_flops_per_s"] = model_flops * double(dist::world().size()) / seconds;
    logged["mfu"] = model_flops / seconds / (peak_gflops * 1e9);
  }
  // Rank 0's memory (the rank that logs), in GB.
  const MemoryUsage m = memory_usage();
  logged["rss_gb"] = m.rss_gb;
  logged["peak_rss_gb"] = m.peak_rss_gb;
  logged["host_allocated_gb"] = m.host_allocated_gb;
  logged["host_peak_gb"] = m.host_peak_gb;
  if (m.gpu_allocated_gb) {
    logged["gpu_allocated_gb"] = *m.gpu_allocated_gb;
    logged["gpu_reserved_gb"] = *m.gpu_reserved_gb;
    logged["gpu_peak_gb"] = *m.gpu_peak_gb;
  }
  return logged;
}

void Trainer::refresh_curves(AsyncMetricWriter& writer) {
  // The picture is drawn from metrics.jsonl, which only rank 0 writes (with progress on).
  if (!deployer_.is_main() || !fs::exists(fs::path(deployer_.workdir()) / "metrics.jsonl")) return;
  trace::Span span("phase", "curves");
  writer.flush();
  write_run_curves(deployer_.workdir());
}

void Trainer::print_epoch(const EpochSummary& summary) {
  std::ostringstream line;
  line << "epoch " << summary.epoch << " | train loss " << std::fixed << std::setprecision(4) << summary.train_loss;
  if (!summary.eval.empty()) {
    line << " | eval";
    for (const auto& [k, v] : summary.eval) line << " " << (k == "eval_loss" ? "loss" : k) << " " << v;
  }
  print(line.str());  // after the step lines it sums up, above the bar
}

void Trainer::print_fit_summary(const FitResult& result, double secs, double training_secs, const FitOptions& o) {
  // What ran, how fast, where the loss went. The rate is the training steps' own, as on the
  // bar: a run whose evaluations or checkpoints take most of its time (a distillation's
  // teacher, a beam search each epoch) read 106 tokens/s here against the bar's 1050.
  const int64_t examples_per_step = o.per_device_batch_size * deployer_.data_size() * o.grad_accum_steps;
  const double per_s = double(int64_t(result.losses.size()) * examples_per_step) / std::max(training_secs, 1e-9);
  std::ostringstream line;
  line << std::fixed << std::setprecision(4) << "fit: " << result.losses.size() << " steps in " << std::setprecision(1)
       << secs << " s (" << training_secs << " s training), " << std::setprecision(0)
       << (o.tokens_per_example > 0 ? per_s * double(o.tokens_per_example) : per_s)
       << (o.tokens_per_example > 0 ? " tokens/s" : " examples/s") << std::setprecision(4) << ", loss "
       << result.losses.front() << " -> " << result.losses.back();
  if (!result.evals.empty())
    for (const auto& [k, v] : result.evals.back()) line << ", " << k << " " << v;
  if (scaler_ && precision_policy().loss_scaling)
    line << std::setprecision(0) << ", loss scale " << scaler_->scale() << " (" << scaler_->skipped_steps()
         << (scaler_->skipped_steps() == 1 ? " step" : " steps") << " skipped on overflow)";
  print(line.str());
}

FitResult Trainer::fit(std::shared_ptr<const data::Dataset> train, const FitOptions& o) {
  MT_CHECK(train != nullptr, "[trainer] fit needs a training dataset");
  const std::optional<BestMetric> best =
      o.save_best_by.empty() ? std::nullopt : std::optional<BestMetric>(BestMetric::parse(o.save_best_by));
  const StepPlan steps = plan_steps(train->size(), o, deployer_);
  set_cuda_graphs(o.cuda_graphs);
  set_loss_scale(o.loss_scale);
  // The CPU is detected (oneDNN queried, the bf16 dot product timed) before the first step,
  // not inside it: the first step's time and profile show the step's own work.
  (void)cpu::cpu_features();
  // A checkpoint still being written when fit ends or throws is completed by the writer's
  // destructor (one process) before fit returns.
  struct ReleaseWriter {
    std::unique_ptr<BackgroundCheckpoints>& writer;
    ~ReleaseWriter() { writer.reset(); }
  } release_writer{checkpoints_};
  data::DataLoader<Batch> loader(train, data::IndexSampler(train->size(), sampler_options(o.per_device_batch_size, o.shuffle, o.epochs)),
                                 collate_, 2);
  if (o.dry_run) dry_run_step(loader, o);
  EpochProgress epoch = o.resume ? resume_into(loader, o) : EpochProgress{};
  std::optional<Profiler> profiler;
  if (!o.profile_steps.empty())
    profiler.emplace(ProfileRange::parse(o.profile_steps), step_, steps.total_steps,
                     (fs::path(deployer_.workdir()) / "profile").string(), [this](const std::string& s) { print(s); });

  std::vector<std::shared_ptr<MetricSink>> sinks = open_metric_sinks(o, steps.total_steps);
  AsyncMetricWriter writer(sinks);
  active_bar_ = sinks.empty() ? nullptr : static_cast<ProgressBar*>(sinks.front().get());
  active_writer_ = &writer;
  struct Release {
    Trainer* t;
    ~Release() { t->active_bar_ = nullptr, t->active_writer_ = nullptr; }
  } release{this};

  FitResult result;
  auto evaluate = [&] {
    trace::Span span("phase", "eval");
    std::map<std::string, double> metrics;
    if (o.eval_data)
      metrics = eval_metrics(o.eval_data, o.per_device_eval_batch_size > 0 ? o.per_device_eval_batch_size
                                                                            : o.per_device_batch_size);
    if (o.eval_fn)
      for (const auto& [k, v] : o.eval_fn(params_)) metrics[k] = v;
    if (metrics.empty()) return metrics;
    result.evals.push_back(metrics);
    writer.push(step_, "eval", std::map<std::string, MetricValue>(metrics.begin(), metrics.end()));
    refresh_curves(writer);
    if (best) {
      auto it = metrics.find(best->name);
      MT_CHECK(it != metrics.end(), "[trainer] save_best_by names '", best->name, "' but evaluation produced no such metric");
      save_checkpoint(CheckpointKind::best, loader.state(), epoch, o, &*best, it->second);
    }
    return metrics;
  };

  // The roof MFU is measured against: given, or probed once on rank 0 (cached per machine).
  double peak_gflops = 0;
  if (o.log_mfu) {
    peak_gflops = o.peak_gflops;
    if (peak_gflops <= 0) {
      // bf16 precision runs bf16 GEMMs where they are native (every GPU; CPUs where
      // cpu_features chose oneDNN's bf16 kernels), else widened GEMMs at the f32 roof.
      const bool bf16_native = current_device().is_cuda() || cpu::cpu_features().bf16_gemm_native;
      const DType dtype = matmul_precision() == MatmulPrecision::bf16 && bf16_native ? DType::bf16 : DType::f32;
      float peak = dist::world().rank() == 0 ? float(gemm_peak_gflops(dtype)) : 0.f;
      dist::world().broadcast(&peak, 1, DType::f32, 0);
      peak_gflops = peak;
    }
  }
  const auto fit_start = std::chrono::steady_clock::now();
  auto last_time = fit_start;
  double training_seconds = 0;  // the steps' own time (data, step, logging), as the bar's rate counts it
  int64_t evaluated_at = -1;
  // Steps enqueued and not yet read (FitOptions::read_loss_every), with what their log line
  // needs; read all at once, then logged in order.
  const int64_t read_every =
      o.read_loss_every > 0 ? o.read_loss_every : (current_device().is_cuda() ? int64_t(16) : int64_t(1));
  struct Unread {
    double lr, flops;
  };
  std::vector<PendingStep> pending;
  std::vector<Unread> unread;
  // The unread steps share the time from the start of their group (last_time) to their read,
  // which includes the wait for the device to finish them.
  auto read_pending = [&] {
    if (pending.empty()) return;
    trace::Span span("phase", "log");
    std::chrono::steady_clock::time_point read_at;
    double seconds = 0;
    // Called once the values are read, step by step with that step's metrics in place.
    read_steps(pending, [&](size_t i, double loss) {
      if (i == 0) {
        read_at = std::chrono::steady_clock::now();
        seconds = std::chrono::duration<double>(read_at - last_time).count() / double(pending.size());
      }
      result.losses.push_back(loss);
      epoch.loss_sum += loss;
      ++epoch.steps;
      writer.push(pending[i].step, "train", step_record(loss, unread[i].lr, seconds, unread[i].flops, peak_gflops, o));
    });
    training_seconds += std::chrono::duration<double>(read_at - last_time).count();
    pending.clear();
    unread.clear();
    last_time = read_at;
  };
  while (step_ < steps.total_steps) {
    if (profiler) profiler->step_begin(step_ + 1);
    std::vector<Batch> micro;
    for (int m = 0; m < o.grad_accum_steps; ++m) {
      std::optional<data::LoadedBatch<Batch>> b;
      {
        trace::Span span("data", "data_wait");
        b = loader.next();
      }
      if (!b) break;
      trace::Span span("data", "batch_assembly");
      micro.push_back(checked_shard(deployer_, b->data, padded_fields_));
    }
    if (int(micro.size()) < o.grad_accum_steps) break;  // the data ran out mid-accumulation
    // The optimizer's own step count, which a step skipped on an f16 overflow does not advance
    // (optax's apply_if_finite), indexes the schedule.
    const int64_t applied = step_ - (scaler_ ? scaler_->skipped_steps() : 0);
    const double lr = o.learning_rate ? o.learning_rate(applied) : 0.0;
    const double flops_before = prim::model_flops();
    pending.push_back(enqueue_step(micro));
    const double step_flops = prim::model_flops() - flops_before;
    unread.push_back({lr, step_flops});
    // An epoch is steps_per_epoch steps; when accumulation does not divide the batches of
    // an epoch, the leftover batches start the next step, as the sampler runs on.
    const bool epoch_end = step_ % steps.steps_per_epoch == 0;
    const bool save_now = o.save_every > 0 && step_ % o.save_every == 0;
    const bool eval_now = (o.eval_every > 0 && step_ % o.eval_every == 0) || epoch_end;
    // What comes next reads the state the losses describe (epoch means, checkpoints, hooks):
    // the pending steps are read first. So does a profiled run, whose steps are timed alone.
    if (int64_t(pending.size()) >= read_every || epoch_end || save_now || eval_now || o.on_step || profiler ||
        step_ >= steps.total_steps)
      read_pending();
    // An ended epoch's mean is taken now, so checkpoints from here on resume into the next
    // epoch, which has no losses yet.
    const double epoch_train_loss = epoch_end ? epoch.loss_sum / double(epoch.steps) : 0.0;
    if (epoch_end) epoch = {};
    if (save_now) save_checkpoint(CheckpointKind::step, loader.state(), epoch, o);
    else if (checkpoints_) checkpoints_->commit_if_written();  // a background save, once on disk
    if (o.on_step) {
      trace::Span span("phase", "on_step");
      o.on_step(step_, params_);
    }
    std::map<std::string, double> metrics;
    if (eval_now) {
      metrics = evaluate();
      evaluated_at = step_;
    }
    if (epoch_end) {
      result.epochs.push_back({(step_ + steps.steps_per_epoch - 1) / steps.steps_per_epoch, step_, epoch_train_loss, metrics});
      if (o.epoch_summary) print_epoch(result.epochs.back());
    }
    if (profiler) profiler->step_end(step_);
    // Throughput counts data, step and logging, not the evaluation, checkpoints or hooks above.
    if (pending.empty()) last_time = std::chrono::steady_clock::now();
    if (stop_agreed()) {
      read_pending();
      // Ctrl-C or SIGTERM on any rank: every rank stops after this same step, with a checkpoint.
      if (o.save_every == 0 || step_ % o.save_every != 0) save_checkpoint(CheckpointKind::step, loader.state(), epoch, o);
      if (checkpoints_) checkpoints_->complete();
      if (profiler) profiler->finish();
      writer.close();
      refresh_curves(writer);
      throw Interrupted(detail::concat("interrupted at step ", step_, "; checkpoint ", step_name(step_), " written in ",
                                       (fs::path(deployer_.workdir()) / "checkpoints").string(),
                                       "; continue with --resume"));
    }
  }
  read_pending();  // the data ran out with steps unread
  if (profiler) profiler->finish();  // the data ran out inside the range
  if (o.eval_at_end && evaluated_at != step_ && !result.losses.empty()) evaluate();
  if (o.save_last && (o.save_every == 0 || step_ % o.save_every != 0))
    save_checkpoint(CheckpointKind::step, loader.state(), epoch, o);
  if (checkpoints_) checkpoints_->complete();
  writer.close();
  refresh_curves(writer);
  result.steps = step_;
  if (!result.losses.empty())
    print_fit_summary(result, std::chrono::duration<double>(std::chrono::steady_clock::now() - fit_start).count(),
                      training_seconds, o);
  return result;
}

}  // namespace mt::train
