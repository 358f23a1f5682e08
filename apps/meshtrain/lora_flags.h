#pragma once
// LoRA on the command line: --lora-rank R (0: full fine-tuning) --lora-alpha --lora-dropout
// --lora-targets REGEX --use-rslora --merge-lora for the training commands, --adapter DIR
// for the commands that run a model.
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/meshtrain/run_flags.h"
#include "meshtrain/models/peft_adapter.h"
#include "meshtrain/optim/transform.h"

namespace mt::cli {

struct LoraFlags {
  int64_t rank = 0;
  double alpha = 16.0;
  double dropout = 0.05;
  std::string targets;  // empty: the model family's attention and MLP projections
  bool rslora = false;
  bool merge = false;   // export the merged model instead of the adapter alone

  bool enabled() const { return rank > 0; }
  models::LoraOptions options() const;
};

void add_lora_flags(CLI::App* cmd, LoraFlags& flags);
// --adapter DIR: a PEFT LoRA directory applied on top of --model.
void add_adapter_flag(CLI::App* cmd, std::string& adapter);
// Loads `adapter` (if not empty) onto the model, logging what it did.
void apply_adapter(models::PretrainedModel& model, const std::string& adapter, bool log);

// The optimizer LoRA trains with: `inner` on the adapters (and on parameters matching
// `also_train`, e.g. a task head; empty: none), every other parameter frozen.
optim::Transform lora_optimizer(optim::Transform inner, const std::string& also_train = "");
// lora_optimizer as a wrap for warmup_cosine_adamw (run_flags.h); none without LoRA.
std::function<optim::Transform(optim::Transform)> lora_wrap(const LoraFlags& lora, const std::string& also_train = "");

// After fit: frees the optimizer state and writes what a training command leaves in
// run.output_dir (a collective, every rank calls it; the main rank writes): with LoRA the PEFT
// adapter in adapter/ (its base named `base_model`, from weights gathered into `model`);
// unless LoRA without --merge-lora the model (adapters merged, its tensors in run.save_dtype)
// in model/, each parameter gathered and written in turn, with the tokenizer copied from
// `tokenizer_source` (none when empty: an image model). True on the main rank, which goes on
// to write the command's other outputs.
bool save_trained_weights(train::Trainer& trainer, models::PretrainedModel& model, const LoraFlags& lora,
                          const std::string& base_model, const std::string& tokenizer_source, const RunFlags& run,
                          const train::Deployer& deployer);

}  // namespace mt::cli
