#include "meshtrain/data/classification_files.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "meshtrain/core/error.h"
#include "meshtrain/data/jsonl_reader.h"
#include "meshtrain/data/table_reader.h"

namespace mt::data {

namespace fs = std::filesystem;

namespace {

struct RawFile {
  std::string path;
  std::vector<Example> rows;
  int header_lines = 0;  // lines before the first row (a CSV header)
  bool typed = false;    // JSON lines keep their value types; CSV fields are strings
};

RawFile read_raw(const std::string& path) {
  MT_CHECK(fs::is_regular_file(path), "[glue] ", path, " does not exist");
  std::string ext = fs::path(path).extension().string();
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  RawFile f{path, {}, 0, false};
  if (ext == ".csv") {
    f.rows = read_csv(path);
    f.header_lines = 1;
  } else if (ext == ".json" || ext == ".jsonl") {
    f.rows = read_jsonl(path);
    f.typed = true;
  } else {
    throw Error(detail::concat("[glue] ", path, ": a data file must be .csv (with a header) or .json/.jsonl (JSON lines)"));
  }
  MT_CHECK(!f.rows.empty(), "[glue] ", path, " has no rows");
  return f;
}

std::string where(const RawFile& f, size_t row) { return f.path + ":" + std::to_string(row + 1 + size_t(f.header_lines)); }

const Value& label_of(const RawFile& f, size_t row) {
  const Value* v = f.rows[row].find("label");
  MT_CHECK(v != nullptr, "[glue] ", where(f, row), ": the row has no 'label' column (columns: ",
           detail::join(f.rows[row].names(), ", "), ")");
  return *v;
}

enum class LabelKind { integer, fractional, text };

// How the label would be typed by a columnar reader: CSV strings that parse as integers are
// integers, as other numbers fractional; JSON keeps its types (1.0 is fractional).
LabelKind kind_of(const Value& v, bool typed) {
  if (std::holds_alternative<int64_t>(v)) return LabelKind::integer;
  if (std::holds_alternative<double>(v)) return LabelKind::fractional;
  if (const auto* s = std::get_if<std::string>(&v); s && !typed) {
    int64_t i = 0;
    double d = 0;
    if (parse_int64(*s, i)) return LabelKind::integer;
    if (parse_float64(*s, d)) return LabelKind::fractional;
  }
  return LabelKind::text;
}

// A class label's spelling: the string, or the integer in decimal.
std::string class_name(const Value& v, const std::string& at) {
  if (const auto* s = std::get_if<std::string>(&v)) {
    int64_t i = 0;
    return parse_int64(*s, i) ? std::to_string(i) : *s;
  }
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  throw Error(detail::concat("[glue] ", at, ": label ", describe(v), " is not a class name"));
}

// The text columns: sentence1/sentence2 when both exist, else the first two other text
// columns, else the only one.
std::pair<std::string, std::string> text_columns(const RawFile& f) {
  std::vector<std::string> names;
  // Row ids (GLUE's "idx") and, in JSON, non-string values are not texts.
  for (const auto& [n, v] : f.rows[0])
    if (n != "label" && n != "idx" && n != "id" && std::holds_alternative<std::string>(v)) names.push_back(n);
  MT_CHECK(!names.empty(), "[glue] ", f.path, " has no text column besides 'label'");
  if (std::count(names.begin(), names.end(), "sentence1") && std::count(names.begin(), names.end(), "sentence2"))
    return {"sentence1", "sentence2"};
  return {names[0], names.size() >= 2 ? names[1] : ""};
}

std::vector<Example> to_examples(const RawFile& f, const GlueTask& task) {
  std::vector<Example> out;
  out.reserve(f.rows.size());
  for (size_t r = 0; r < f.rows.size(); ++r) {
    const Example& row = f.rows[r];
    Example e;
    for (const auto& [column, field] : {std::pair{task.text_a, "text_a"}, std::pair{task.text_b, "text_b"}}) {
      if (column.empty()) continue;
      const Value* v = row.find(column);
      MT_CHECK(v != nullptr, "[glue] ", where(f, r), ": the row has no '", column, "' column");
      const auto* s = std::get_if<std::string>(v);
      MT_CHECK(s != nullptr, "[glue] ", where(f, r), ": column '", column, "' holds ", describe(*v), ", not text");
      e.set(field, *s);
    }
    const Value& label = label_of(f, r);
    if (task.is_regression()) {
      double v = 0;
      bool ok = true;
      if (const auto* s = std::get_if<std::string>(&label)) ok = parse_float64(*s, v);
      else if (const auto* d = std::get_if<double>(&label)) v = *d;
      else if (const auto* i = std::get_if<int64_t>(&label)) v = double(*i);
      else ok = false;
      MT_CHECK(ok, "[glue] ", where(f, r), ": label ", describe(label), " is not a number (the task is regression)");
      e.set("label", v);
    } else {
      const std::string name = class_name(label, where(f, r));
      auto it = std::find(task.label_names.begin(), task.label_names.end(), name);
      MT_CHECK(it != task.label_names.end(), "[glue] ", where(f, r), ": label '", name, "' is not one of the classes ",
               detail::join(task.label_names, ", "));
      e.set("label", int64_t(it - task.label_names.begin()));
    }
    out.push_back(std::move(e));
  }
  return out;
}

GlueTask task_for(const RawFile& f, std::vector<std::string> label_names) {
  GlueTask t;
  t.name = "custom";
  t.directory = fs::path(f.path).parent_path().string();
  t.label = "label";
  std::tie(t.text_a, t.text_b) = text_columns(f);
  t.metrics = label_names.empty() ? "stsb" : "sst2";  // Pearson/Spearman, or accuracy as HF's script reports
  t.label_names = std::move(label_names);
  t.dev_split = "validation";
  return t;
}

}  // namespace

ClassificationFiles read_classification_files(const std::string& train_file, const std::string& validation_file) {
  const RawFile train = read_raw(train_file), validation = read_raw(validation_file);
  std::set<LabelKind> kinds;
  for (size_t r = 0; r < train.rows.size(); ++r) kinds.insert(kind_of(label_of(train, r), train.typed));
  std::vector<std::string> classes;
  if (kinds.count(LabelKind::text) || !kinds.count(LabelKind::fractional)) {
    std::set<std::string> distinct;
    for (size_t r = 0; r < train.rows.size(); ++r) distinct.insert(class_name(label_of(train, r), where(train, r)));
    classes.assign(distinct.begin(), distinct.end());
    // Integer classes sort by value (HF sorts the label column's values).
    if (!kinds.count(LabelKind::text))
      std::sort(classes.begin(), classes.end(),
                [](const std::string& a, const std::string& b) { return std::stoll(a) < std::stoll(b); });
    MT_CHECK(classes.size() >= 2, "[glue] ", train_file, ": every row has label '", classes[0],
             "'; classification needs at least two classes");
  }
  ClassificationFiles out;
  out.task = task_for(train, classes);
  const auto [a, b] = text_columns(validation);
  MT_CHECK(a == out.task.text_a && b == out.task.text_b, "[glue] ", validation_file, " has text columns '", a, "'",
           b.empty() ? "" : ", '" + b + "'", " but ", train_file, " has '", out.task.text_a, "'",
           out.task.text_b.empty() ? "" : ", '" + out.task.text_b + "'");
  out.train = to_examples(train, out.task);
  out.validation = to_examples(validation, out.task);
  return out;
}

GlueTask classification_task(const std::string& file, std::vector<std::string> label_names) {
  return task_for(read_raw(file), std::move(label_names));
}

std::vector<Example> read_classification_rows(const std::string& file, const GlueTask& task) {
  return to_examples(read_raw(file), task);
}

}  // namespace mt::data
