#pragma once
// What the commands that train a pretrained decoder share (finetune, dpo, grpo, distill):
// loading the model and its tokenizer, the optimizer flags and the AdamW they build (warmup +
// cosine to 10 %, gradient clipping, LoRA's adapters-only partition), and the export at the
// end (the weights gathered from their shards into `adapter/` and/or `model/`).
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/optim/schedule.h"
#include "meshtrain/optim/transform.h"
#include "meshtrain/train/trainer.h"

namespace mt::cli {

// A decoder from a Hugging Face directory, a meshtrain run or checkpoint, or a llama2.c file;
// anything else (BERT, T5) is an error naming `command` and the model type.
std::shared_ptr<models::PretrainedModel> load_decoder(const std::string& path, const models::PretrainedOptions& options,
                                                      const std::string& command);

struct OptimizerFlags {
  double learning_rate = 0;  // 0: the command's default (with or without LoRA)
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
  int64_t eval_steps = 0;
  int64_t save_steps = 0;
};
// --learning-rate (its help naming the defaults), --warmup-steps, --weight-decay,
// --max-grad-norm, --eval-steps, --save-steps; set the flags' defaults first.
void add_optimizer_flags(CLI::App* cmd, OptimizerFlags& flags, const std::string& learning_rate_help);

struct DecoderOptimizer {
  optim::Transform transform;
  optim::Schedule learning_rate;
  int64_t schedule_steps = 0;  // what the schedule spans (checkpoints record it)
  int64_t trainable = 0;       // parameters it trains
};
// AdamW over `params` for a run of `total_steps`, peak rate flags.learning_rate or
// `default_rate`; with LoRA only the adapters train.
DecoderOptimizer decoder_optimizer(const OptimizerFlags& flags, const RunFlags& run, int64_t total_steps, double default_rate,
                                   const LoraFlags& lora, const Params& params, const char* command);

// Fills `f`'s evaluation and checkpoint cadence, the run flags' part, the learning rate and
// the checkpoint's model record (config, tokenizer, LoRA, schedule span).
void apply_training_flags(const OptimizerFlags& flags, const RunFlags& run, const DecoderOptimizer& opt,
                          const models::PretrainedModel& model, const std::string& tokenizer_source, train::FitOptions& f);

// After fit: save_trained_weights (lora_flags.h), then names where the metrics are.
void export_trained_model(train::Trainer& trainer, models::PretrainedModel& model, const LoraFlags& lora,
                          const std::string& base_model, const std::string& tokenizer_source, const RunFlags& run,
                          const train::Deployer& deployer);

}  // namespace mt::cli
