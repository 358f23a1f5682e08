#include "meshtrain/train/checkpoint_model.h"

#include <filesystem>

#include "meshtrain/core/error.h"
#include "meshtrain/io/json.h"
#include "meshtrain/models/lora.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/train/checkpoint.h"

namespace mt::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::optional<std::string> find_checkpoint(const fs::path& path, bool prefer_best) {
  if (fs::exists(path / "meta.json")) return path.string();
  for (const fs::path& dir : {path, path / "checkpoints"}) {
    if (prefer_best && fs::exists(dir / "best" / "meta.json")) return (dir / "best").string();
    if (auto latest = CheckpointManager(dir.string()).latest()) return latest;
    if (fs::exists(dir / "best" / "meta.json")) return (dir / "best").string();
  }
  return std::nullopt;
}

}  // namespace

bool is_checkpoint_path(const std::string& path) {
  return fs::is_directory(path) && find_checkpoint(path, false).has_value();
}

std::string resolve_checkpoint(const std::string& path, bool prefer_best) {
  MT_CHECK(fs::exists(path), "[checkpoint] ", path, " does not exist");
  std::optional<std::string> found = find_checkpoint(path, prefer_best);
  MT_CHECK(found.has_value(), "[checkpoint] ", path,
           " holds no checkpoint (expected meta.json, or checkpoints/step_N/meta.json of a run)");
  return *found;
}

json checkpoint_model_extra(const json& model_config, const std::string& tokenizer_path,
                            const models::LoraOptions& lora) {
  json extra = {{"model_config", model_config}};
  if (!tokenizer_path.empty()) extra["tokenizer"] = tokenizer_path;
  if (lora.enabled())
    extra["lora"] = {{"rank", lora.rank}, {"alpha", lora.alpha}, {"dropout", lora.dropout},
                     {"use_rslora", lora.use_rslora}, {"targets", lora.targets}};
  return extra;
}

models::PretrainedModel load_checkpoint_model(const std::string& path, const dist::Mesh& mesh,
                                              const models::PretrainedOptions& options) {
  const std::string dir = resolve_checkpoint(path);
  CheckpointState state = CheckpointManager::restore(dir, mesh);
  MT_CHECK(state.extra.contains("model_config") && state.extra["model_config"].is_object(), "[checkpoint] ", dir,
           "/meta.json has no extra.model_config: it was not saved with its model's configuration");
  models::PretrainedOptions o = options;
  o.load_tokenizer = false;  // the checkpoint names its tokenizer itself
  o.new_params = models::NewParams::none;  // a checkpoint holds every parameter of its model
  // A LoRA run's adapters are set aside while the base matches its config, then checked
  // against the adapters that config with the run's LoRA options declares.
  Params adapters;
  if (state.extra.contains("lora"))
    for (const std::string& path : state.params.paths())
      if (models::is_lora_path(path)) {
        adapters.set(path, state.params[path]);
        state.params.erase(path);
      }
  models::PretrainedModel model = models::model_from_checkpoint(state.extra["model_config"], std::move(state.params), dir, o);
  if (state.extra.contains("lora")) {
    const json& l = state.extra["lora"];
    models::LoraOptions lora;
    lora.rank = l.value("rank", int64_t(0));
    lora.alpha = l.value("alpha", 8.0);
    lora.dropout = l.value("dropout", 0.0);
    lora.use_rslora = l.value("use_rslora", false);
    lora.targets = l.value("targets", std::string());
    model.config = model.config.with_lora(lora);
    for (const models::ParamDef& d : model.param_defs()) {
      if (!models::is_lora_path(d.path)) continue;
      MT_CHECK(adapters.contains(d.path), "[checkpoint] ", dir, " lacks the adapter ", d.path, " its LoRA options declare");
      MT_CHECK(adapters[d.path].shape() == d.shape, "[checkpoint] ", dir, ": ", d.path, " has shape ",
               adapters[d.path].shape().str(), ", expected ", d.shape.str());
      model.params.set(d.path, adapters[d.path]);
    }
  }
  if (options.load_tokenizer && state.extra.contains("tokenizer")) {
    fs::path tok = state.extra["tokenizer"].get<std::string>();
    if (tok.is_relative()) tok = fs::path(dir) / tok;
    MT_CHECK(fs::exists(tok), "[checkpoint] ", dir, " names tokenizer ", tok.string(), ", which does not exist");
    model.tokenizer = tokenizers::load_tokenizer(tok.lexically_normal().string());
  }
  return model;
}

}  // namespace mt::train
