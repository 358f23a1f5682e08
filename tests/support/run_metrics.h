#pragma once
// What end-to-end tests read back from a run directory's metrics.jsonl.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
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

}  // namespace mt::testing
