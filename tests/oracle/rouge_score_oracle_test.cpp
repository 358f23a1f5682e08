// ROUGE-1/2/L/Lsum, stemmed and not, against Google's `rouge-score` package itself (PyPI, in
// the project's .venv; tests/python/rouge_reference.py) on 600 pairs of real text: Tiny
// Shakespeare passages (several lines, so ROUGE-Lsum sees sentences) scored against
// neighbouring passages, against themselves with words dropped and shuffled, and SST-2
// sentences against each other. Every precision, recall and F-measure equal to 1e-12.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "meshtrain/train/rouge.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

using nlohmann::json;

std::vector<std::string> lines_of(const std::string& path, size_t n, bool tsv) {
  std::ifstream in(path);
  std::string line;
  if (tsv) std::getline(in, line);  // header
  std::vector<std::string> out;
  while (out.size() < n && std::getline(in, line)) {
    if (tsv) line = line.substr(0, line.find('\t'));
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> real_pairs() {
  const auto lines = lines_of(std::string(MT_DATA_DIR) + "/text/tinyshakespeare.txt", 1300, false);
  const auto sst = lines_of(std::string(MT_DATA_DIR) + "/glue/SST-2/dev.tsv", 201, true);
  std::mt19937 rng(5);
  auto passage = [&](size_t i, size_t n) {
    std::string s;
    for (size_t k = 0; k < n; ++k) s += (k ? "\n" : "") + lines[i + k];
    return s;
  };
  std::vector<std::pair<std::string, std::string>> pairs;
  for (size_t i = 0; i + 8 < lines.size() && pairs.size() < 200; i += 6) pairs.push_back({passage(i, 3), passage(i + 2, 3)});
  for (size_t i = 0; i + 8 < lines.size() && pairs.size() < 400; i += 6) {
    std::istringstream words(passage(i, 4));
    std::vector<std::string> w((std::istream_iterator<std::string>(words)), std::istream_iterator<std::string>());
    std::shuffle(w.begin() + long(w.size() / 2), w.end(), rng);  // the second half out of order
    std::string pred;
    for (size_t k = 0; k < w.size(); ++k)
      if (rng() % 4) pred += (k % 7 == 6 ? "\n" : " ") + w[k];  // a quarter of the words dropped
    pairs.push_back({passage(i, 4), pred});
  }
  for (size_t i = 0; i + 1 < sst.size(); ++i) pairs.push_back({sst[i], sst[i + 1]});
  return pairs;
}

using RougeScoreOracle = TempDir;

TEST_F(RougeScoreOracle, EveryScoreEqualsTheRougeScorePackage) {
  const auto pairs = real_pairs();
  ASSERT_EQ(pairs.size(), 600u);
  const std::string in = (dir_ / "pairs.jsonl").string(), out = (dir_ / "scores.jsonl").string();
  {
    std::ofstream f(in);
    for (const auto& [t, p] : pairs) f << json::array({t, p}).dump() << "\n";
  }
  const std::string cmd = std::string(MT_VENV_PYTHON) + " " + MT_SOURCE_DIR + "/tests/python/rouge_reference.py < " + in +
                          " > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  std::string line;
  size_t i = 0, compared = 0;
  double worst = 0;
  while (std::getline(f, line)) {
    ASSERT_LT(i, pairs.size());
    const json ref = json::parse(line);
    for (const bool stem : {true, false}) {
      const train::RougeScores s = train::rouge(pairs[i].first, pairs[i].second, stem);
      const json& r = ref.at(stem ? "stem" : "plain");
      const std::pair<const char*, const train::RougeScore*> kinds[] = {
          {"rouge1", &s.rouge1}, {"rouge2", &s.rouge2}, {"rougeL", &s.rougeL}, {"rougeLsum", &s.rougeLsum}};
      for (const auto& [name, score] : kinds) {
        const double ours[3] = {score->precision, score->recall, score->fmeasure};
        for (int k = 0; k < 3; ++k) {
          const double e = std::abs(ours[k] - r.at(name)[size_t(k)].get<double>());
          worst = std::max(worst, e);
          ++compared;
          EXPECT_LE(e, 1e-12) << name << (stem ? " stemmed" : "") << " of pair " << i << ": target "
                              << json(pairs[i].first).dump() << " prediction " << json(pairs[i].second).dump();
        }
      }
    }
    ++i;
  }
  EXPECT_EQ(i, pairs.size());
  std::cout << "[rouge-score] " << i << " pairs, " << compared << " values: max |err| " << worst << "\n";
}

}  // namespace
}  // namespace mt::testing
