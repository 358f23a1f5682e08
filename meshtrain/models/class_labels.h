#pragma once
// A classifier's classes in config.json, as Hugging Face's PretrainedConfig keeps them:
// num_labels, or the size of id2label, and the names in id order from id2label.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::models {

struct ClassLabels {
  int64_t num_labels = 2;
  std::vector<std::string> names;  // empty: HF's generated names LABEL_i
};

// From config.json: num_labels (else id2label's size, else `fallback_count`) and the names,
// kept only when id2label names every id once and not with HF's generated LABEL_i.
ClassLabels read_class_labels(const nlohmann::json& j, const char* what, int64_t fallback_count = 2);
// The caller's classes over the config's: a count, or names (which set the count); names that
// do not match the count are dropped (HF's generated LABEL_i are used).
void override_class_labels(int64_t& num_labels, std::vector<std::string>& names, std::optional<int64_t> count,
                           const std::vector<std::string>& given_names);
// The classes' names in id order for reports: the names, or "0".."n-1" where unnamed.
std::vector<std::string> class_names(int64_t num_labels, const std::vector<std::string>& names);
// id2label and label2id for config.json (LABEL_i where unnamed).
void write_class_labels(nlohmann::json& j, int64_t num_labels, const std::vector<std::string>& names);

}  // namespace mt::models
