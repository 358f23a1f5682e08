#pragma once
// config.json accessors whose errors name the model and the missing or mistyped key.
#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"

namespace mt::models {

// Reads config key `key`; a missing or mistyped key throws mt::Error naming `what`
// ("gpt2 config") and the key.
template <class T>
T config_get(const nlohmann::json& j, const char* key, const char* what) {
  MT_CHECK(j.is_object(), "[", what, "] config must be a JSON object");
  auto it = j.find(key);
  MT_CHECK(it != j.end() && !it->is_null(), "[", what, "] missing key '", key, "' in config.json");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::concat("[", what, "] key '", key, "' has the wrong type (", it->type_name(), "): ", e.what()));
  }
}
// The same with a default for absent or null keys (HF's config defaults).
template <class T>
T config_get(const nlohmann::json& j, const char* key, const char* what, const T& fallback) {
  MT_CHECK(j.is_object(), "[", what, "] config must be a JSON object");
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return config_get<T>(j, key, what);
}

}  // namespace mt::models
