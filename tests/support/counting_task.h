#pragma once
// The post-training end-to-end tests' task: "<word><n> counts to d" -> "d+1" (the answer
// depends on the last digit only), and a small GPT-2 pretrained on the default corpus then
// fine-tuned on 600 such rows for one epoch, which answers about half of new prompts.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"

namespace mt::testing {

struct Counting {
  std::string prompt;
  int digit;
  std::string answer() const { return std::to_string(digit + 1); }
};

inline std::vector<Counting> counting(int n, uint32_t seed) {
  static const char* words[] = {"apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "pixel", "ember", "lunar",
                                "frost", "cedar", "amber", "delta", "sigma", "noble", "quiet", "rapid", "solar", "vivid"};
  std::mt19937 rng(seed);
  std::vector<Counting> rows;
  for (int i = 0; i < n; ++i) {
    const int d = int(rng() % 9);
    rows.push_back({std::string(words[rng() % 20]) + std::to_string(rng() % 100) + " counts to " + std::to_string(d), d});
  }
  return rows;
}

// Builds the fine-tuned model under `dir` (~7 s on 2 cores) and returns its model folder.
// Test suites build it once (CountingSuite) and share it read-only.
inline std::filesystem::path counting_sft_model(const std::filesystem::path& dir) {
  const std::filesystem::path base = dir / "base", sft = dir / "sft", rows = dir / "sft.jsonl";
  EXPECT_EQ(run_cli("pretrain --model gpt2 --seq-len 64 --steps 150 --output-dir " + base.string()).code, 0);
  std::ofstream out(rows);
  for (const Counting& c : counting(600, 7))
    out << nlohmann::json{{"instruction", c.prompt}, {"output", c.answer()}}.dump() << "\n";
  out.close();
  CliRun r = run_cli("finetune --model " + (base / "model").string() + " --data " + rows.string() +
                     " --prompt-field instruction --response-field output --seq-len 32 --learning-rate 1e-3 --epochs 1 "
                     "--output-dir " + sft.string());
  EXPECT_EQ(r.code, 0);
  return sft / "model";
}

// One fine-tuned counting model shared by a test suite's tests: the fixture calls set_up()
// and tear_down() from its SetUpTestSuite / TearDownTestSuite; the first test that asks
// builds it in the suite's own folder, removed after the suite.
struct SharedCountingModel {
  static void set_up() {
    dir() = std::filesystem::temp_directory_path() / ("mt_counting_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir());
  }
  static void tear_down() { std::filesystem::remove_all(dir()); }
  static std::filesystem::path sft_model() {
    static const std::filesystem::path model = counting_sft_model(dir());
    return model;
  }
  static std::filesystem::path& dir() {
    static std::filesystem::path d;
    return d;
  }
};

}  // namespace mt::testing
