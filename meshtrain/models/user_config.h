#pragma once
// A config.json a user writes to size a model (`pretrain --config`, `glue --config`, `seq2seq
// --config`): Hugging Face's aliases of a key are honoured (GPT-2's hidden_size is n_embd, as
// its config's attribute_map says) and a key the model does not know is an error naming it,
// the nearest known key and the known ones, so nothing typed there is silently ignored.
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/models/model_spec.h"

namespace mt::models {

// `defaults` with `user`'s keys (aliases renamed first) merged over them. Throws mt::Error
// starting "[command] source:" for an unknown key, or an alias given beside its key with
// another value.
nlohmann::json merge_user_config(const ModelSpec& spec, nlohmann::json defaults, const nlohmann::json& user,
                                 const std::string& source, const char* command);

}  // namespace mt::models
