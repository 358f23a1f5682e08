#pragma once
// What end-to-end tests read back from a run: its metrics.jsonl, numbers in its output, and
// the run as if stopped at an earlier checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cstdio>
#include <map>
#include <regex>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>

namespace mt::testing {

// Train losses by step; a step logged twice is a failure.
inline std::map<int64_t, double> train_losses(const std::filesystem::path& run_dir) {
  std::map<int64_t, double> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("split", "") != "train" || !j.contains("loss")) continue;
    const int64_t step = j["step"].get<int64_t>();
    EXPECT_FALSE(out.count(step)) << run_dir << "/metrics.jsonl logs step " << step << " twice";
    out[step] = j["loss"].get<double>();
  }
  return out;
}

// The lines of metrics.jsonl of one split ("train", "eval").
inline std::vector<nlohmann::json> metric_lines(const std::filesystem::path& run_dir, const std::string& split) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (nlohmann::json j = nlohmann::json::parse(line); j.value("split", "") == split) out.push_back(j);
  return out;
}

// The number the first group of `pattern` captures in `text` (a failure naming the pattern
// when there is none).
inline double number_after(const std::string& text, const std::string& pattern) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(text, m, std::regex(pattern))) << pattern << " not in:\n" << text;
  return m.empty() ? -1 : std::stod(m[1].str());
}

// A copy of `run_dir` at `copy` as if the run had stopped after its checkpoint at step
// `keep`: the checkpoint of step `last` removed and metrics.jsonl cut after step `keep`.
inline void stopped_copy(const std::filesystem::path& run_dir, const std::filesystem::path& copy, int64_t keep, int64_t last) {
  namespace fs = std::filesystem;
  fs::copy(run_dir, copy, fs::copy_options::recursive);
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(last));
  fs::remove_all(copy / "checkpoints" / name);
  std::ifstream in(copy / "metrics.jsonl");
  std::string kept;
  for (std::string line; std::getline(in, line);)
    if (nlohmann::json::parse(line).value("step", int64_t(0)) <= keep) kept += line + "\n";
  in.close();
  std::ofstream(copy / "metrics.jsonl") << kept;
}

}  // namespace mt::testing
