#include "meshtrain/data/glue.h"

#include <algorithm>
#include <filesystem>

#include "meshtrain/core/error.h"
#include "meshtrain/data/table_reader.h"

namespace mt::data {

namespace fs = std::filesystem;

const std::vector<GlueTask>& all_glue_tasks() {
  static const std::vector<GlueTask> tasks = [] {
    std::vector<GlueTask> t;
    // CoLA: source, label, original annotation, sentence; no header.
    t.push_back({"cola", "CoLA", false, "", "", "", 3, 1, {"0", "1"}});
    t.push_back({"sst2", "SST-2", true, "sentence", "", "label", -1, -1, {"0", "1"}});
    t.push_back({"mrpc", "MRPC", true, "#1 String", "#2 String", "Quality", -1, -1, {"0", "1"}});
    t.push_back({"stsb", "STS-B", true, "sentence1", "sentence2", "score", -1, -1, {}});
    t.push_back({"qqp", "QQP", true, "question1", "question2", "is_duplicate", -1, -1, {"0", "1"}});
    t.push_back({"mnli", "MNLI", true, "sentence1", "sentence2", "gold_label", -1, -1,
                 {"entailment", "neutral", "contradiction"}, "dev_matched"});
    // HF's names for MNLI scored on one of its two dev sets.
    for (const char* dev : {"dev_matched", "dev_mismatched"}) {
      t.push_back(t.back());
      t.back().name = std::string("mnli_") + (dev + 4);
      t.back().dev_split = dev;
    }
    t.push_back({"qnli", "QNLI", true, "question", "sentence", "label", -1, -1, {"entailment", "not_entailment"}});
    t.push_back({"rte", "RTE", true, "sentence1", "sentence2", "label", -1, -1, {"entailment", "not_entailment"}});
    t.push_back({"wnli", "WNLI", true, "sentence1", "sentence2", "label", -1, -1, {"0", "1"}});
    return t;
  }();
  return tasks;
}

namespace {

std::string normalized(const std::string& name) {
  std::string out;
  for (char c : name)
    if (c != '-' && c != '_') out.push_back(char(std::tolower(static_cast<unsigned char>(c))));
  return out;
}

}  // namespace

const GlueTask& glue_task(const std::string& name) {
  const std::string n = normalized(name);
  std::string names;
  for (const GlueTask& t : all_glue_tasks()) {
    if (normalized(t.name) == n) return t;
    names += (names.empty() ? "" : ", ") + t.name;
  }
  throw Error(detail::concat("[glue] unknown task '", name, "' (tasks: ", names, ")"));
}

std::string glue_task_dir(const std::string& data_dir, const GlueTask& task) {
  const fs::path root(data_dir);
  for (const char* f : {"train.tsv", "dev.tsv", "dev_matched.tsv"})
    if (fs::is_regular_file(root / f) && (root.filename() == task.directory || !fs::is_directory(root / task.directory)))
      return root.string();
  MT_CHECK(fs::is_directory(root / task.directory), "[glue] neither ", data_dir, " nor ", (root / task.directory).string(),
           " holds the ", task.directory, " TSV files (train.tsv, ", task.dev_split, ".tsv)");
  return (root / task.directory).string();
}

std::vector<Example> read_glue_split(const std::string& data_dir, const GlueTask& task, const std::string& split) {
  const std::string file = (fs::path(glue_task_dir(data_dir, task)) / (split + ".tsv")).string();
  MT_CHECK(fs::is_regular_file(file), "[glue] ", task.name, ": ", file, " does not exist");
  TableOptions o;
  o.header = task.header;
  if (task.header) {
    o.columns = {Column(task.text_a)};
    if (!task.text_b.empty()) o.columns.push_back(Column(task.text_b));
    o.columns.push_back(Column(task.label));
  } else {
    o.columns = {Column(task.text_a_index), Column(task.label_index)};
  }
  std::vector<Example> rows = read_tsv(file, o);
  std::vector<Example> out;
  out.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Example& r = rows[i];
    Example e;
    size_t col = 0;
    e.set("text_a", r.begin()[col++].second);
    if (!task.text_b.empty()) e.set("text_b", r.begin()[col++].second);
    const std::string& raw = std::get<std::string>(r.begin()[col].second);
    // Line numbers count the header line (1-based, as editors show them).
    const size_t line = i + 1 + (task.header ? 1 : 0);
    if (task.is_regression()) {
      size_t used = 0;
      double v = 0;
      try {
        v = std::stod(raw, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      MT_CHECK(used == raw.size() && !raw.empty(), "[glue] ", file, ":", line, ": column '", task.label, "' holds '", raw,
               "', not a number");
      e.set("label", v);
    } else {
      auto it = std::find(task.label_names.begin(), task.label_names.end(), raw);
      if (it == task.label_names.end()) {
        std::string names;
        for (const auto& l : task.label_names) names += (names.empty() ? "" : ", ") + l;
        throw Error(detail::concat("[glue] ", file, ":", line, ": label '", raw, "' is not one of ", names));
      }
      e.set("label", int64_t(it - task.label_names.begin()));
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace mt::data
