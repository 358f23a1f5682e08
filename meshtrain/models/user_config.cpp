#include "meshtrain/models/user_config.h"

#include <set>

#include "meshtrain/core/error.h"
#include "meshtrain/core/spelling.h"
#include "meshtrain/models/pretrained.h"

namespace mt::models {

namespace {

// Keys of every Hugging Face config (PretrainedConfig's own attributes and the files' metadata)
// that a model may carry without using them.
const std::set<std::string>& generic_keys() {
  static const std::set<std::string> keys = {
      "model_type", "architectures", "torch_dtype", "transformers_version", "_name_or_path", "id2label",
      "label2id", "use_cache", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
      "tie_word_embeddings", "output_hidden_states", "output_attentions", "return_dict", "is_decoder",
      "is_encoder_decoder", "gradient_checkpointing", "problem_type", "task_specific_params"};
  return keys;
}

}  // namespace

nlohmann::json merge_user_config(const ModelSpec& spec, nlohmann::json defaults, const nlohmann::json& user,
                                 const std::string& source, const char* command) {
  MT_CHECK(user.is_object(), "[", command, "] ", source, ": a config must be a JSON object");
  nlohmann::json renamed = nlohmann::json::object();
  for (const auto& [key, value] : user.items()) {
    std::string name = key;
    for (const auto& [alias, canonical] : spec.config_aliases)
      if (key == alias) name = canonical;
    if (name != key && user.contains(name))
      MT_CHECK(user[name] == value, "[", command, "] ", source, ": '", key, "' is ", spec.model_type, "'s '", name,
               "', given both as ", value.dump(), " and ", user[name].dump());
    renamed[name] = value;
  }
  // Known: what the model writes to its config.json (every key it reads), the command's own
  // defaults, the aliases and the generic keys.
  std::set<std::string> known(generic_keys());
  for (const auto& [key, value] : defaults.items()) known.insert(key);
  defaults.merge_patch(renamed);
  PretrainedOptions o;
  const nlohmann::json written = spec.config_json(spec.parse_config(defaults, o));  // items() needs it alive
  for (const auto& [key, value] : written.items()) known.insert(key);
  for (const auto& [alias, canonical] : spec.config_aliases) known.insert(alias);
  for (const auto& [key, value] : user.items()) {
    if (known.count(key)) continue;
    std::vector<std::string> names(known.begin(), known.end());
    const std::string near = nearest_spelling(key, names);
    std::string list;  // the model's own keys (not Hugging Face's generic ones)
    for (const std::string& n : names)
      if (!generic_keys().count(n)) list += (list.empty() ? "" : ", ") + n;
    throw Error(detail::concat("[", command, "] ", source, ": unknown key '", key, "' for ", spec.model_type,
                               near.empty() ? "" : " (did you mean '" + near + "'?)", "; known keys: ", list));
  }
  return defaults;
}

}  // namespace mt::models
