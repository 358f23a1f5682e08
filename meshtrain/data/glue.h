#pragma once
// The GLUE benchmark's files as its download script distributes them: one directory per
// task (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI) of TSVs whose layouts differ —
// CoLA has no header, MRPC's header starts with a BOM, label names differ per task (RTE and
// QNLI say entailment / not_entailment, MNLI has three classes), STS-B is regression on a
// 0–5 score. Rows become {"text_a", ["text_b",] "label"} examples with labels numbered as
// Hugging Face's `glue` dataset numbers them.
#include <string>
#include <vector>

#include "meshtrain/data/example.h"

namespace mt::data {

struct GlueTask {
  std::string name;       // "cola", "sst2", ... (lower case, as glue_metrics takes)
  std::string directory;  // "CoLA", "SST-2", ...
  bool header = true;
  // Columns by header name, or by index in a headerless file ("" for single sentences).
  std::string text_a, text_b, label;
  int text_a_index = -1, label_index = -1;
  std::vector<std::string> label_names;  // label i's spelling in the file; empty: regression
  std::string dev_split = "dev";         // MNLI: dev_matched
  std::string metrics = "";              // the GLUE task whose metrics score it (empty: name)

  const std::string& metric_task() const { return metrics.empty() ? name : metrics; }
  bool is_regression() const { return label_names.empty(); }
  int64_t num_labels() const { return is_regression() ? 1 : int64_t(label_names.size()); }
};

// The task by name (case, '-' and '_' insensitive: "SST-2", "sst2", "STS-B",
// "mnli_mismatched"); "mnli" and "mnli_matched" evaluate on dev_matched, "mnli_mismatched"
// on dev_mismatched, as HF's glue dataset splits them; throws mt::Error
// listing the tasks for an unknown one.
const GlueTask& glue_task(const std::string& name);
const std::vector<GlueTask>& all_glue_tasks();

// The directory holding the task's TSVs: data_dir itself if it has train/dev files, else
// data_dir/<task directory>. Throws mt::Error naming both when neither exists.
std::string glue_task_dir(const std::string& data_dir, const GlueTask& task);

// Rows of split ("train", "dev", or "dev_matched" / "dev_mismatched" for MNLI). A label
// that is not one of the task's names throws mt::Error naming file, line and value; rows
// with a wrong field count or a missing column likewise name file and line.
std::vector<Example> read_glue_split(const std::string& data_dir, const GlueTask& task, const std::string& split);

}  // namespace mt::data
