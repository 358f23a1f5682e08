#pragma once
// Models saved by training runs. A Trainer checkpoint whose meta.json carries
// "model_config" (the content of a config.json) and optionally "tokenizer" (a tokenizer
// path) in its extra state loads like a Hugging Face directory: `generate` and `eval`
// accept checkpoints, and a run directory stands for its newest checkpoint.
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/distributed/mesh.h"
#include "meshtrain/models/pretrained.h"

namespace mt::train {

// The checkpoint directory `path` names: itself if it holds meta.json; for a run's workdir
// (or its checkpoints/ folder) the newest step checkpoint, or `best` when prefer_best.
// Throws mt::Error naming the path when there is none.
std::string resolve_checkpoint(const std::string& path, bool prefer_best = false);

// True when `path` is a checkpoint, a checkpoints/ folder or a run directory holding one.
bool is_checkpoint_path(const std::string& path);

// What a checkpoint's meta.json says about its model: {"model_config": ..., "tokenizer": path};
// a relative tokenizer path is taken from the checkpoint directory (so a run directory can
// move: "../../model" is the run's model/ folder).
// A LoRA model's adapter options are kept too (`lora`), so its checkpoints load with adapters.
nlohmann::json checkpoint_model_extra(const nlohmann::json& model_config, const std::string& tokenizer_path,
                                      const models::LoraOptions& lora = {});

// Collective over `mesh`: the checkpoint's parameters (laid out replicated) as a model, its
// tokenizer loaded when options.load_tokenizer and the checkpoint names one.
models::PretrainedModel load_checkpoint_model(const std::string& path, const dist::Mesh& mesh,
                                              const models::PretrainedOptions& options = {});

}  // namespace mt::train
