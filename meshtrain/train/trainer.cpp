#include "meshtrain/train/trainer.h"

#include <chrono>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "meshtrain/autodiff/value_and_grad.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/data_loader.h"
#include "meshtrain/dist/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/train/async_metric_writer.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/jsonl_logger.h"
#include "meshtrain/train/progress.h"
#include "meshtrain/train/tensorboard.h"

namespace mt::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

Trainer::Trainer(Deployer& deployer, CollateFn collate, LossFn loss, Params params, optim::Transform optimizer,
                 std::optional<ShardingPlan> plan, int)
    : deployer_(deployer), collate_(std::move(collate)), loss_(std::move(loss)), optimizer_(std::move(optimizer)),
      plan_(std::move(plan)) {
  MT_CHECK(collate_ && loss_, "[trainer] collate and loss functions are required");
  // Parameters take the plan's layout; optimizer slots follow them (zeros_like).
  params_ = plan_ ? plan_->shard(params) : std::move(params);
  opt_state_ = optimizer_.init(params_);
}

dist::PartitionSpec Trainer::spec_for(const std::string& group, const std::string& path) const {
  if (!plan_) return {};
  if (group == "params") return plan_->spec(path);
  // Optimizer slots are "<slot>.<param path>" (possibly nested by chain: "1.mu.<path>").
  for (size_t pos = path.find('.'); pos != std::string::npos; pos = path.find('.', pos + 1)) {
    const std::string rest = path.substr(pos + 1);
    for (const PlanEntry& e : plan_->entries())
      if (e.path == rest) return e.spec;
  }
  return {};
}

double Trainer::train(const std::vector<Batch>& micro_batches) {
  MT_CHECK(!micro_batches.empty(), "[trainer] a step needs at least one micro-batch");
  const RngKey key = deployer_.step_key(step_);
  const double loss = custom_step_ ? custom_step_(params_, opt_state_, micro_batches, key) : default_step(micro_batches, key);
  ++step_;
  return loss;
}

void Trainer::print(const std::string& text) {
  if (!deployer_.is_main()) return;
  if (active_writer_) active_writer_->flush();
  if (active_bar_) active_bar_->message(text);
  else deployer_.log(text);
}

double Trainer::default_step(const std::vector<Batch>& micro_batches, const RngKey& key) {
  Params grads;
  double loss_total = 0;
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const Batch& batch = micro_batches[m];
    const RngKey micro_key = key.fold_in(m);
    auto [loss, g] = value_and_grad([&](const Params& p) { return loss_(p, batch, micro_key, true); })(params_);
    loss_total += dist::to_host(loss).item();
    if (grads.empty()) {
      grads = std::move(g);
    } else {
      for (auto& [path, acc] : grads) acc = add(acc, g[path]);
    }
  }
  if (micro_batches.size() > 1)
    for (auto& [path, acc] : grads) acc = div(acc, double(micro_batches.size()));
  params_ = optim::apply_updates(params_, optimizer_.update(grads, opt_state_, params_));
  return loss_total / double(micro_batches.size());
}

double Trainer::eval_loss(std::shared_ptr<const data::Dataset> dataset, int64_t per_device_batch_size) {
  MT_CHECK(dataset != nullptr, "[trainer] eval_loss needs a dataset");
  data::SamplerOptions so;
  so.shuffle = false;
  so.drop_remainder = true;
  so.batch_size = per_device_batch_size * deployer_.data_size();
  so.process_index = deployer_.data_index();
  so.process_count = deployer_.data_size();
  MT_CHECK(dataset->size() >= so.batch_size, "[trainer] the eval set has ", dataset->size(),
           " examples, fewer than one global batch of ", so.batch_size);
  data::DataLoader<Batch> loader(dataset, data::IndexSampler(dataset->size(), so), collate_, 1);
  double total = 0;
  int64_t batches = 0;
  autodiff::NoGradGuard no_grad;
  while (auto b = loader.next()) {
    Batch batch = deployer_.shard_batch(b->data);
    total += dist::to_host(loss_(params_, batch, deployer_.step_key(-1), false)).item();
    ++batches;
  }
  return total / double(batches);
}

void Trainer::save_checkpoint(const std::string& kind, const json& data_state, const json& extra, int keep_last,
                              const std::string& metric, double value, const std::string& mode) {
  json meta = extra.is_object() ? extra : json::object();
  meta["data"] = data_state;
  meta["seed"] = deployer_.options().seed;
  meta["mesh"] = deployer_.mesh().str();
  CheckpointState state{step_, 0, params_, opt_state_, meta};
  CheckpointManager manager((fs::path(deployer_.workdir()) / "checkpoints").string(), keep_last);
  if (kind == "best") manager.save_best(state, deployer_.mesh(), metric, value, mode);
  else manager.save(state, deployer_.mesh());
}

std::optional<json> Trainer::restore_latest(const json& expected_extra) {
  CheckpointManager manager((fs::path(deployer_.workdir()) / "checkpoints").string());
  std::optional<std::string> latest = manager.latest();
  if (!latest) return std::nullopt;
  CheckpointState state = CheckpointManager::restore(
      *latest, deployer_.mesh(), [this](const std::string& g, const std::string& p) { return spec_for(g, p); });
  // The checkpoint must be this model's: same configuration (when both name one), same
  // parameters with the same shapes and dtypes.
  if (expected_extra.contains("model_config") && state.extra.contains("model_config"))
    MT_CHECK(state.extra["model_config"] == expected_extra["model_config"], "[trainer] cannot resume from ", *latest,
             ": it was trained with model config ", state.extra["model_config"].dump(), ", this run builds ",
             expected_extra["model_config"].dump(), " (flags such as --seq-len or --config differ)");
  MT_CHECK(state.params.paths() == params_.paths(), "[trainer] checkpoint ", *latest,
           " holds different parameters than the model");
  for (const auto& [path, p] : params_)
    MT_CHECK(state.params[path].shape() == p.shape() && state.params[path].dtype() == p.dtype(), "[trainer] cannot resume from ",
             *latest, ": parameter '", path, "' is ", state.params[path].str(), " there and ", p.str(), " in this model");
  params_ = state.params;
  opt_state_ = state.opt_state;
  step_ = state.step;
  deployer_.log("resumed from " + *latest + " at step " + std::to_string(step_));
  json extra = state.extra;
  extra["checkpoint"] = *latest;
  return extra;
}

FitResult Trainer::fit(std::shared_ptr<const data::Dataset> train, const FitOptions& o) {
  MT_CHECK(train != nullptr, "[trainer] fit needs a training dataset");
  MT_CHECK(o.per_device_batch_size > 0 && o.grad_accum_steps > 0, "[trainer] batch size and accumulation must be positive");
  MT_CHECK(o.save_best_by.empty() || o.save_best_by.rfind("max:", 0) == 0 || o.save_best_by.rfind("min:", 0) == 0,
           "[trainer] save_best_by must look like 'max:accuracy' or 'min:eval_loss', got '", o.save_best_by, "'");
  data::SamplerOptions so;
  so.seed = deployer_.options().seed;
  so.shuffle = o.shuffle;
  so.drop_remainder = true;
  so.num_epochs = o.epochs;
  so.batch_size = o.per_device_batch_size * deployer_.data_size();
  so.process_index = deployer_.data_index();
  so.process_count = deployer_.data_size();
  data::IndexSampler sampler(train->size(), so);
  MT_CHECK(sampler.batches_per_epoch() > 0, "[trainer] ", train->size(), " training examples make no global batch of ",
           so.batch_size);
  data::DataLoader<Batch> loader(train, sampler, collate_, 2);
  const int64_t steps_per_epoch = sampler.batches_per_epoch() / o.grad_accum_steps;
  int64_t total_steps = steps_per_epoch * o.epochs;
  if (o.max_steps >= 0) total_steps = std::min(total_steps, o.max_steps);

  MT_CHECK(steps_per_epoch > 0, "[trainer] an epoch of ", sampler.batches_per_epoch(), " batches makes no step of ",
           o.grad_accum_steps, " accumulated micro-batches");
  json resumed_epoch_progress;  // the interrupted epoch's loss so far, from the checkpoint
  if (o.resume)
    if (std::optional<json> resumed = restore_latest(o.checkpoint_extra);
        resumed && resumed->contains("data") && !(*resumed)["data"].is_null()) {
      const std::string from = resumed->value("checkpoint", std::string());
      resumed_epoch_progress = resumed->value("epoch_progress", json());
      try {
        loader.restore((*resumed)["data"].get<data::SamplerState>());
      } catch (const Error& e) {
        // The data position is tied to the global batch (per-device batch x data ranks), seed
        // and dataset: say which checkpoint and which settings have to match.
        throw Error(detail::concat("[trainer] cannot resume the data position of ", from, ": ", e.what(),
                                   " (keep per-device batch size x data-parallel ranks, the seed and the dataset as "
                                   "they were)"));
      }
    }

  std::vector<std::shared_ptr<MetricSink>> sinks;
  std::shared_ptr<ProgressBar> bar;
  if (o.progress && deployer_.is_main()) {
    fs::create_directories(deployer_.workdir());
    ProgressOptions po;
    po.start_step = step_;
    bar = std::make_shared<ProgressBar>(total_steps, po);
    sinks.push_back(bar);
    JsonlLoggerOptions jo;
    jo.resume_step = step_;
    sinks.push_back(std::make_shared<JsonlLogger>((fs::path(deployer_.workdir()) / "metrics.jsonl").string(), jo));
    sinks.push_back(std::make_shared<TensorBoardWriter>((fs::path(deployer_.workdir()) / "tensorboard").string()));
  }
  AsyncMetricWriter writer(sinks);
  active_bar_ = bar.get();
  active_writer_ = &writer;
  struct Release {
    Trainer* t;
    ~Release() { t->active_bar_ = nullptr, t->active_writer_ = nullptr; }
  } release{this};
  FitResult result;
  const std::string best_metric = o.save_best_by.empty() ? "" : o.save_best_by.substr(4);
  const std::string best_mode = o.save_best_by.empty() ? "" : o.save_best_by.substr(0, 3);
  // The current epoch's losses so far; checkpoints carry them so that the epoch's train
  // loss after a resume covers the steps run before the interruption too.
  double epoch_loss = resumed_epoch_progress.is_object() ? resumed_epoch_progress.value("loss_sum", 0.0) : 0.0;
  int64_t epoch_steps = resumed_epoch_progress.is_object() ? resumed_epoch_progress.value("steps", int64_t(0)) : 0;
  json extra = o.checkpoint_extra.is_object() ? o.checkpoint_extra : json::object();
  auto checkpoint_extra = [&] {
    extra["epoch_progress"] = {{"loss_sum", epoch_loss}, {"steps", epoch_steps}};
    return extra;
  };
  auto evaluate = [&] {
    std::map<std::string, double> metrics;
    if (o.eval_data)
      metrics["eval_loss"] = eval_loss(o.eval_data, o.per_device_eval_batch_size > 0 ? o.per_device_eval_batch_size
                                                                                         : o.per_device_batch_size);
    if (o.eval_fn)
      for (const auto& [k, v] : o.eval_fn(params_)) metrics[k] = v;
    if (metrics.empty()) return metrics;
    result.evals.push_back(metrics);
    std::map<std::string, MetricValue> values(metrics.begin(), metrics.end());
    writer.push(step_, "eval", values);
    if (!best_metric.empty()) {
      auto it = metrics.find(best_metric);
      MT_CHECK(it != metrics.end(), "[trainer] save_best_by names '", best_metric, "' but evaluation produced no such metric");
      save_checkpoint("best", loader.state(), checkpoint_extra(), o.keep_last, best_metric, it->second, best_mode);
    }
    return metrics;
  };

  const int64_t examples_per_step = o.per_device_batch_size * deployer_.data_size() * o.grad_accum_steps;
  const auto fit_start = std::chrono::steady_clock::now();
  auto last_time = fit_start;
  int64_t evaluated_at = -1;
  while (step_ < total_steps) {
    std::vector<Batch> micro;
    for (int m = 0; m < o.grad_accum_steps; ++m) {
      std::optional<data::LoadedBatch<Batch>> b = loader.next();
      if (!b) break;
      micro.push_back(deployer_.shard_batch(b->data));
    }
    if (int(micro.size()) < o.grad_accum_steps) break;  // the data ran out mid-accumulation
    const double lr = o.learning_rate ? o.learning_rate(step_) : 0.0;
    double loss = this->train(micro);
    result.losses.push_back(loss);
    epoch_loss += loss;
    ++epoch_steps;
    auto now = std::chrono::steady_clock::now();
    double secs = std::chrono::duration<double>(now - last_time).count();
    last_time = now;
    std::map<std::string, MetricValue> logged{{"loss", loss}};
    if (o.learning_rate) logged["lr"] = lr;
    if (o.tokens_per_example > 0) logged["tokens_per_s"] = double(examples_per_step * o.tokens_per_example) / secs;
    else logged["examples_per_s"] = double(examples_per_step) / secs;
    writer.push(step_, "train", logged);
    // An epoch is steps_per_epoch steps; when accumulation does not divide the batches of
    // an epoch, the leftover batches start the next step, as the sampler runs on.
    const bool epoch_end = step_ % steps_per_epoch == 0;
    // An ended epoch's mean is taken now, so checkpoints from here on resume into the next
    // epoch, which has no losses yet.
    const double epoch_train_loss = epoch_end ? epoch_loss / double(epoch_steps) : 0.0;
    if (epoch_end) epoch_loss = 0, epoch_steps = 0;
    if (o.save_every > 0 && step_ % o.save_every == 0) save_checkpoint("step", loader.state(), checkpoint_extra(), o.keep_last);
    if (o.on_step) o.on_step(step_, params_);
    std::map<std::string, double> metrics;
    if ((o.eval_every > 0 && step_ % o.eval_every == 0) || epoch_end) {
      metrics = evaluate();
      evaluated_at = step_;
    }
    if (epoch_end) {
      EpochSummary summary{(step_ + steps_per_epoch - 1) / steps_per_epoch, step_, epoch_train_loss, metrics};
      result.epochs.push_back(summary);
      if (o.epoch_summary) {
        std::ostringstream line;
        line << "epoch " << summary.epoch << " | train loss " << std::fixed << std::setprecision(4) << summary.train_loss;
        if (!metrics.empty()) {
          line << " | eval";
          for (const auto& [k, v] : metrics) line << " " << (k == "eval_loss" ? "loss" : k) << " " << v;
        }
        print(line.str());  // after the step lines it sums up, above the bar
      }
    }
  }
  if (o.eval_at_end && evaluated_at != step_ && !result.losses.empty()) evaluate();
  if (o.save_last && (o.save_every == 0 || step_ % o.save_every != 0))
    save_checkpoint("step", loader.state(), checkpoint_extra(), o.keep_last);
  writer.close();
  result.steps = step_;
  if (!result.losses.empty()) {
    // The final summary: what ran, how fast, where the loss went.
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - fit_start).count();
    const double per_s = double(result.losses.size() * examples_per_step) / secs;
    std::ostringstream line;
    line << std::fixed << std::setprecision(4) << "fit: " << result.losses.size() << " steps in " << std::setprecision(1)
         << secs << " s, " << std::setprecision(0) << (o.tokens_per_example > 0 ? per_s * double(o.tokens_per_example) : per_s)
         << (o.tokens_per_example > 0 ? " tokens/s" : " examples/s") << std::setprecision(4) << ", loss "
         << result.losses.front() << " -> " << result.losses.back();
    if (!result.evals.empty())
      for (const auto& [k, v] : result.evals.back()) line << ", " << k << " " << v;
    print(line.str());
  }
  return result;
}

}  // namespace mt::train
