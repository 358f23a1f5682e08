#pragma once
// The texts the tokenizer conformance test and benchmark encode: every sentence (or
// sentence pair) of the GLUE TSV files and every line of Tiny Shakespeare. Header-only,
// no gtest, so bench/ can use it too.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace mt::test {

struct TextInput {
  std::string a;
  std::optional<std::string> b;  // the second sentence of a pair task
};

struct GlueFileStats {
  std::string file;
  size_t rows = 0, skipped = 0;
};

namespace detail_inputs {
inline std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t t = line.find('\t', start);
    out.push_back(line.substr(start, t == std::string::npos ? std::string::npos : t - start));
    if (t == std::string::npos) break;
    start = t + 1;
  }
  return out;
}
inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}
}  // namespace detail_inputs

// GLUE as the tasks define their inputs: CoLA and SST-2 single sentences; MRPC, RTE,
// STS-B, WNLI, QNLI (and MNLI/QQP when present) pairs. Columns are found by header name;
// CoLA's train/dev have no header (sentence in column 3), MRPC's header starts with a BOM.
// Rows too short for the task's columns are skipped and counted in `stats`.
inline std::vector<TextInput> glue_inputs(const std::string& glue_dir, std::vector<GlueFileStats>* stats = nullptr) {
  namespace fs = std::filesystem;
  const std::map<std::string, std::pair<std::string, std::string>> columns = {
      {"CoLA", {"sentence", ""}},        {"SST-2", {"sentence", ""}},         {"MRPC", {"#1 String", "#2 String"}},
      {"RTE", {"sentence1", "sentence2"}}, {"WNLI", {"sentence1", "sentence2"}}, {"STS-B", {"sentence1", "sentence2"}},
      {"QNLI", {"question", "sentence"}}, {"MNLI", {"sentence1", "sentence2"}}, {"QQP", {"question1", "question2"}}};
  std::vector<TextInput> out;
  for (const auto& [task, cols] : columns) {
    const fs::path dir = fs::path(glue_dir) / task;
    if (!fs::is_directory(dir)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".tsv") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      auto lines = detail_inputs::read_lines(f.string());
      GlueFileStats st{task + "/" + f.filename().string()};
      if (lines.empty()) continue;
      std::string header = lines[0];
      if (header.rfind("\xEF\xBB\xBF", 0) == 0) header = header.substr(3);
      const auto names = detail_inputs::split_tabs(header);
      int ia = -1, ib = -1;
      for (size_t k = 0; k < names.size(); ++k) {
        if (names[k] == cols.first) ia = int(k);
        if (!cols.second.empty() && names[k] == cols.second) ib = int(k);
      }
      size_t first = 1;
      if (ia < 0 && task == "CoLA") {  // no header: source, label, annotation, sentence
        ia = 3;
        first = 0;
      }
      if (ia < 0 || (!cols.second.empty() && ib < 0))
        throw std::runtime_error("GLUE file " + f.string() + ": cannot find columns '" + cols.first + "'/'" +
                                 cols.second + "' in header '" + header + "'");
      for (size_t r = first; r < lines.size(); ++r) {
        if (lines[r].empty()) continue;
        const auto fields = detail_inputs::split_tabs(lines[r]);
        ++st.rows;
        if (int(fields.size()) <= std::max(ia, ib)) {
          ++st.skipped;
          continue;
        }
        TextInput in{fields[size_t(ia)], std::nullopt};
        if (ib >= 0) in.b = fields[size_t(ib)];
        out.push_back(std::move(in));
      }
      if (stats) stats->push_back(st);
    }
  }
  return out;
}

inline std::vector<TextInput> text_lines(const std::string& path) {
  std::vector<TextInput> out;
  for (auto& l : detail_inputs::read_lines(path)) out.push_back({std::move(l), std::nullopt});
  return out;
}

}  // namespace mt::test
