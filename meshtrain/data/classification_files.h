#pragma once
// A user's own sentence(-pair) classification or regression data, read the way Hugging
// Face's run_glue scripts read --train_file / --validation_file: CSV (with a header) or JSON
// lines, a "label" column, and the texts in "sentence1"/"sentence2" when both exist, else
// the first two other text columns (not "idx"/"id", in JSON only strings), else the only one. Integer or string labels make a
// classification task whose classes are the sorted distinct training labels; fractional
// numbers make a regression task. The result is a GlueTask, so `glue` trains, evaluates and
// scores it like a GLUE task (accuracy, or Pearson/Spearman for regression).
#include <string>
#include <vector>

#include "meshtrain/data/example.h"
#include "meshtrain/data/glue.h"

namespace mt::data {

struct ClassificationFiles {
  GlueTask task;                   // name "custom", label_names = the classes in id order
  std::vector<Example> train, validation;  // {"text_a", ["text_b",] "label"} as read_glue_split
};

// Reads both files (same columns). Errors name file and line: an unsupported extension, a
// row without "label", a validation label not among the training labels, a non-numeric
// regression label, a file with no text column or no rows.
ClassificationFiles read_classification_files(const std::string& train_file, const std::string& validation_file);

// Rows of `file` for a task whose columns and classes are known (a model's id2label):
// evaluation of a model trained on read_classification_files data.
std::vector<Example> read_classification_rows(const std::string& file, const GlueTask& task);

// A task for `file`'s columns with the given classes (empty: regression).
GlueTask classification_task(const std::string& file, std::vector<std::string> label_names);

}  // namespace mt::data
