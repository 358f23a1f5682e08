#include "meshtrain/train/checkpoint_model.h"

#include <filesystem>

#include "meshtrain/core/error.h"
#include "meshtrain/io/json.h"
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

json checkpoint_model_extra(const json& model_config, const std::string& tokenizer_path) {
  json extra = {{"model_config", model_config}};
  if (!tokenizer_path.empty()) extra["tokenizer"] = tokenizer_path;
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
  models::PretrainedModel model = models::model_from_checkpoint(state.extra["model_config"], std::move(state.params), dir, o);
  if (options.load_tokenizer && state.extra.contains("tokenizer")) {
    fs::path tok = state.extra["tokenizer"].get<std::string>();
    if (tok.is_relative()) tok = fs::path(dir) / tok;
    MT_CHECK(fs::exists(tok), "[checkpoint] ", dir, " names tokenizer ", tok.string(), ", which does not exist");
    model.tokenizer = tokenizers::load_tokenizer(tok.lexically_normal().string());
  }
  return model;
}

}  // namespace mt::train
