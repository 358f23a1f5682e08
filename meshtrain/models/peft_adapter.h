#pragma once
// LoRA on a whole PretrainedModel, and adapters as Hugging Face PEFT stores them: a
// directory with adapter_config.json (peft_type "LORA", r, lora_alpha, lora_dropout,
// target_modules, use_rslora, fan_in_fan_out, base_model_name_or_path, task_type) and
// adapter_model.safetensors whose keys are "base_model.model.<module>.lora_A.weight" [r, in]
// and "base_model.model.<module>.lora_B.weight" [out, r].
#include <string>

#include "meshtrain/models/lora.h"
#include "meshtrain/models/pretrained.h"

namespace mt::models {

// Adds fresh adapters to a model that has none: A Kaiming-uniform from `key`, B zero, in the
// parameters' dtype; the model's config then carries `options` (targets resolved to the
// family's default when empty). Errors as lora_targets.
void add_lora(PretrainedModel& model, LoraOptions options, const RngKey& key);
// The model with every adapter folded into its weight and removed (a plain model).
PretrainedModel merge_lora(const PretrainedModel& model);
// The regex (whole path) of the parameters LoRA trains: the adapters.
std::string lora_parameter_pattern();

// True when `dir` holds adapter_config.json.
bool is_adapter_dir(const std::string& dir);
// Writes the model's adapters (host arrays) as a PEFT directory; `base_model` is recorded as
// base_model_name_or_path. `modules_to_save` names modules trained in full beside the
// adapters (a task head: "classifier", "pooler"), matched as PEFT matches them (the module
// or a suffix of its path); their parameters are saved under
// "base_model.model.<parameter path>" as PEFT stores them. Throws when the model has no
// adapters.
void save_adapter(const PretrainedModel& model, const std::string& dir, const std::string& base_model,
                  const std::vector<std::string>& modules_to_save = {});
// The options the base model must be loaded with for the adapter in `dir` to fit: a
// sequence-classification adapter (task_type SEQ_CLS) makes a BERT a classifier with as
// many labels as the adapter's saved classifier, its head then coming from the adapter.
void adapter_base_options(const std::string& dir, PretrainedOptions& options);
// Loads a PEFT LoRA directory onto a model without adapters. An adapter for another base (a
// module the model lacks, a shape that differs, adapters missing for a targeted module) is an
// error naming the key, the shapes and both sources; so are a non-LORA peft_type and
// malformed files. Saved modules_to_save parameters replace the model's; a SEQ_CLS adapter
// without its classifier is refused. Returns the paths of the parameters it replaced.
std::vector<std::string> load_adapter(PretrainedModel& model, const std::string& dir);

}  // namespace mt::models
