#include "apps/meshtrain/decoder_training.h"

#include <filesystem>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/optim/partition.h"
#include "meshtrain/train/checkpoint_model.h"

namespace mt::cli {

namespace fs = std::filesystem;

std::shared_ptr<models::PretrainedModel> load_decoder(const std::string& path, const models::PretrainedOptions& options,
                                                      const std::string& command) {
  auto m = std::make_shared<models::PretrainedModel>(
      train::is_checkpoint_path(path) ? train::load_checkpoint_model(path, dist::Mesh::single(), options)
                                      : models::from_pretrained(path, options));
  MT_CHECK(m->is_causal_lm(), "[", command, "] ", path, ": model_type '", m->model_type, "' is not a decoder",
           command == "finetune" ? " (use glue for BERT)" : "");
  return m;
}

void add_optimizer_flags(CLI::App* cmd, OptimizerFlags& f, const std::string& learning_rate_help) {
  cmd->add_option("--learning-rate", f.learning_rate, learning_rate_help);
  cmd->add_option("--warmup-steps", f.warmup_steps, "linear warmup steps, then cosine to 10%")->capture_default_str();
  cmd->add_option("--weight-decay", f.weight_decay, "AdamW weight decay")->capture_default_str();
  add_max_grad_norm_flag(cmd, f.max_grad_norm);
  cmd->add_option("--eval-steps", f.eval_steps, "evaluate every N steps (0: each epoch)")->capture_default_str();
  cmd->add_option("--save-steps", f.save_steps, "checkpoint every N steps (0: only the last)")->capture_default_str();
}

DecoderOptimizer decoder_optimizer(const OptimizerFlags& f, const RunFlags& run, int64_t total_steps, double default_rate,
                                   const LoraFlags& lora, const Params& params, const char* command) {
  DecoderOptimizer d;
  const double peak = f.learning_rate > 0 ? f.learning_rate : default_rate;
  d.schedule_steps = schedule_steps(run, total_steps);
  const int64_t warmup = fitting_warmup(f.warmup_steps, d.schedule_steps, command);
  d.learning_rate = optim::warmup_cosine_decay_schedule(0.0, peak, warmup, d.schedule_steps, peak * 0.1);
  optim::Transform adamw = optim::adamw(d.learning_rate, 0.9, 0.999, 1e-8, f.weight_decay);
  d.transform = optim::chain({gradient_clipping(f.max_grad_norm), lora.enabled() ? lora_optimizer(adamw) : adamw});
  for (const auto& [path, p] : optim::split_frozen(d.transform, params).first) d.trainable += p.numel();
  return d;
}

void apply_training_flags(const OptimizerFlags& flags, const RunFlags& run, const DecoderOptimizer& opt,
                          const models::PretrainedModel& model, const std::string& tokenizer_source, train::FitOptions& f) {
  f.eval_every = flags.eval_steps;
  f.save_every = flags.save_steps;
  apply_run_flags(run, f);
  f.checkpoint_extra = train::checkpoint_model_extra(model.config_json(), fs::absolute(tokenizer_source).string(), model.config.lora());
  f.checkpoint_extra["schedule_steps"] = opt.schedule_steps;
  f.learning_rate = opt.learning_rate;
}

void export_trained_model(train::Trainer& trainer, models::PretrainedModel& model, const LoraFlags& lora,
                          const std::string& base_model, const std::string& tokenizer_source, const RunFlags& run,
                          const train::Deployer& deployer) {
  save_trained_weights(trainer, model, lora, base_model, tokenizer_source, run, deployer);
  const fs::path out = run.output_dir;
  deployer.log("metrics in " + (out / "metrics.jsonl").string() + ", curves in " + (out / "curves.svg").string());
}

}  // namespace mt::cli
