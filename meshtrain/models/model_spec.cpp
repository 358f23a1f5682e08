#include "meshtrain/models/model_spec.h"

#include "meshtrain/core/error.h"

namespace mt::models {

bool only_weight(const Params& p, const std::string& module) {
  const std::string weight = module + ".weight";
  for (const auto& [path, value] : p.with_prefix(module + "."))
    if (path != weight) return false;
  return p.contains(weight);
}

namespace {

// The registry itself: the one place that lists the built-in models. An explicit list
// rather than static registration objects, which a static library's linker may drop.
const std::vector<ModelSpec>& registry() {
  static const std::vector<ModelSpec> specs = {minigpt_model_spec(), gpt2_model_spec(), llama_model_spec(),
                                               bert_model_spec(),    t5_model_spec(),   bart_model_spec(),
                                               vit_model_spec(),     vision_encoder_decoder_model_spec()};
  return specs;
}

}  // namespace

const ModelSpec& model_spec(const std::string& model_type) {
  for (const ModelSpec& s : registry())
    if (s.model_type == model_type) return s;
  throw Error(detail::concat("[model] unknown model_type '", model_type, "' (supported: ", model_types_text(), ")"));
}

std::vector<const ModelSpec*> model_specs(std::optional<ModelKind> kind) {
  std::vector<const ModelSpec*> out;
  for (const ModelSpec& s : registry())
    if (!kind || s.kind == *kind) out.push_back(&s);
  return out;
}

std::vector<std::string> model_types(std::optional<ModelKind> kind) {
  std::vector<std::string> out;
  for (const ModelSpec* s : model_specs(kind)) out.push_back(s->model_type);
  return out;
}

std::string model_types_text(std::optional<ModelKind> kind) {
  const std::vector<std::string> types = model_types(kind);
  std::string text;
  for (size_t i = 0; i < types.size(); ++i) text += (i == 0 ? "" : i + 1 == types.size() ? " or " : ", ") + types[i];
  return text;
}

}  // namespace mt::models
