#include "meshtrain/models/class_labels.h"

#include "meshtrain/models/config_access.h"

namespace mt::models {

ClassLabels read_class_labels(const nlohmann::json& j, const char* what, int64_t fallback_count) {
  ClassLabels c;
  c.num_labels = fallback_count;
  if (j.contains("num_labels")) c.num_labels = config_get<int64_t>(j, "num_labels", what);
  else if (j.contains("id2label") && j["id2label"].is_object()) c.num_labels = int64_t(j["id2label"].size());
  if (j.contains("id2label") && j["id2label"].is_object() && int64_t(j["id2label"].size()) == c.num_labels) {
    std::vector<std::string> names(size_t(c.num_labels));
    bool complete = true;
    for (const auto& [id, name] : j["id2label"].items()) {
      int64_t i = -1;
      try {
        i = std::stoll(id);
      } catch (const std::exception&) {
      }
      complete = complete && i >= 0 && i < c.num_labels && name.is_string() && names[size_t(i)].empty();
      if (complete) names[size_t(i)] = name.get<std::string>();
    }
    // HF's generated names (LABEL_0, LABEL_1, ...) carry nothing: keep none.
    if (complete && names[0] != "LABEL_0") c.names = std::move(names);
  }
  return c;
}

void override_class_labels(int64_t& num_labels, std::vector<std::string>& names, std::optional<int64_t> count,
                           const std::vector<std::string>& given_names) {
  if (count) num_labels = *count;
  if (!given_names.empty()) {
    names = given_names;
    num_labels = int64_t(given_names.size());
  }
  if (int64_t(names.size()) != num_labels) names.clear();
}

void write_class_labels(nlohmann::json& j, int64_t num_labels, const std::vector<std::string>& names) {
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  const bool named = int64_t(names.size()) == num_labels;
  for (int64_t i = 0; i < num_labels; ++i) {
    const std::string name = named ? names[size_t(i)] : "LABEL_" + std::to_string(i);
    id2label[std::to_string(i)] = name;
    label2id[name] = i;
  }
  j["id2label"] = id2label;
  j["label2id"] = label2id;
}

std::vector<std::string> class_names(int64_t num_labels, const std::vector<std::string>& names) {
  if (!names.empty()) return names;
  std::vector<std::string> numbered;
  for (int64_t i = 0; i < num_labels; ++i) numbered.push_back(std::to_string(i));
  return numbered;
}

}  // namespace mt::models
