#pragma once
// Typed access to tokenizer.json keys, with errors that name the file and the key path
// (shared by the loaders of each tokenizer family; internal to meshtrain/tokenizers).
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"

namespace mt::tokenizers {

struct Reader {
  std::string path;

  [[noreturn]] void fail(std::string what) const {
    if (what.rfind("[tokenizer] ", 0) == 0) what = what.substr(12);  // rethrown from a constructor
    throw Error(detail::concat("[tokenizer] ", path, ": ", what));
  }
  const nlohmann::json& at(const nlohmann::json& obj, const std::string& key, const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key)) fail(detail::concat("missing key '", where, key, "'"));
    return obj.at(key);
  }
  template <class T>
  T get(const nlohmann::json& obj, const std::string& key, const std::string& where, T fallback) const {
    if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return fallback;
    return as<T>(obj.at(key), where + key);
  }
  template <class T>
  T as(const nlohmann::json& v, const std::string& name) const {
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception&) {
      fail(detail::concat("key '", name, "' has the wrong type (", v.type_name(), ")"));
    }
  }
  std::string type_of(const nlohmann::json& obj, const std::string& where) const {
    return as<std::string>(at(obj, "type", where), where + "type");
  }
};

}  // namespace mt::tokenizers
