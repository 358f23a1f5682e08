// BLEU against sacrebleu (tests/python/bleu_reference.py, sacrebleu from PyPI) on real
// sentences: STS-B's dev pairs (image and video captions, news, forums), one sentence against
// its pair as the reference, and with a second reference on every third row (references per
// hypothesis vary, as COCO's do); corpora of 1, 3, 10, 100 and all pairs (short corpora hit
// the smoothing of zero matches and the brevity penalty); edge lines (entities, numbers with
// points, commas and dashes, non-ASCII, an empty hypothesis) and a pair whose 3- and 4-grams
// never match (sacrebleu's smoothing). The 13a tokenization equals
// sacrebleu's on every line; scores, precisions, brevity penalty and lengths agree (max error
// printed).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/data/table_reader.h"
#include "meshtrain/train/bleu.h"

namespace mt::testing {
namespace {

using nlohmann::json;

struct Case {
  std::string name;
  std::vector<std::string> hypotheses;
  std::vector<std::vector<std::string>> references;
};

std::vector<Case> cases() {
  const auto rows = data::read_tsv(std::string(MT_DATA_DIR) + "/glue/STS-B/dev.tsv");
  std::vector<std::string> a, b;
  for (const auto& row : rows) a.push_back(row.str("sentence1")), b.push_back(row.str("sentence2"));
  std::vector<Case> out;
  for (size_t n : {size_t(1), size_t(3), size_t(10), size_t(100), a.size()}) {
    Case c{"stsb_" + std::to_string(n), {}, {}};
    for (size_t i = 0; i < n; ++i) {
      c.hypotheses.push_back(a[i]);
      c.references.push_back({b[i]});
      if (i % 3 == 2 && i + 1 < b.size()) c.references.back().push_back(b[i + 1]);
    }
    out.push_back(c);
  }
  out.push_back({"edges",
                 {"The price rose 3.5% to $1,000 in 2010-2011, &quot;officials&quot; said.", "", "Cafés à Paris ,ok.",
                  "a b c", "x<skipped>y -\nz"},
                 {{"The price rose 3.5 % to $ 1,000 in 2010 - 2011, \"officials\" said."},
                  {"nothing was said"},
                  {"Cafés à Paris, ok."},
                  {"a b c d", "a b"},
                  {"xy z"}}});
  // No 3- or 4-gram matches: sacrebleu's "exp" smoothing (1/2, then 1/4 of a match).
  out.push_back({"smoothed", {"the cat sat quietly on the mat today"}, {{"the cat lay on a mat", "a cat sat on it"}}});
  return out;
}

json run_sacrebleu(const std::vector<Case>& cs, const std::vector<std::string>& lines) {
  const auto dir = std::filesystem::temp_directory_path() / ("mt_bleu_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  json spec = {{"cases", json::array()}, {"lines", lines}};
  for (const Case& c : cs) spec["cases"].push_back({{"name", c.name}, {"hypotheses", c.hypotheses}, {"references", c.references}});
  std::ofstream(dir / "in.json") << spec.dump();
  const std::string cmd = std::string(MT_VENV_PYTHON) + " " + MT_SOURCE_DIR + "/tests/python/bleu_reference.py " +
                          (dir / "in.json").string() + " " + (dir / "out.json").string() + " 2>&1";
  if (std::system(cmd.c_str()) != 0) throw Error("sacrebleu failed: " + cmd);
  json out = json::parse(std::ifstream(dir / "out.json"));
  std::filesystem::remove_all(dir);
  return out;
}

TEST(Bleu, CorpusScoresAndTokensEqualSacrebleu) {
  const std::vector<Case> cs = cases();
  std::vector<std::string> lines;
  for (const Case& c : cs) {
    if (c.name != "stsb_" + std::to_string(cs[4].hypotheses.size()) && c.name != "edges") continue;
    for (size_t i = 0; i < c.hypotheses.size(); ++i) {
      lines.push_back(c.hypotheses[i]);
      for (const auto& r : c.references[i]) lines.push_back(r);
    }
  }
  const json want = run_sacrebleu(cs, lines);
  size_t same = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    // sacrebleu's rstrip happens before its tokenizer.
    std::string line = lines[i];
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    const std::string got = train::tokenize_13a(line);
    same += got == want["tokens"][i].get<std::string>();
    EXPECT_EQ(got, want["tokens"][i].get<std::string>()) << lines[i];
  }
  std::printf("13a tokens: %zu of %zu lines equal sacrebleu %s's\n", same, lines.size(),
              want["sacrebleu"].get<std::string>().c_str());
  double worst = 0;
  for (const Case& c : cs) {
    const train::BleuScore s = train::corpus_bleu(c.hypotheses, c.references);
    const json& w = want["cases"][c.name];
    auto check = [&](double got, double expected, const std::string& what) {
      const double e = std::fabs(got - expected);
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-9 * std::max(1.0, std::fabs(expected))) << c.name << " " << what;
    };
    check(s.score, w["score"], "score");
    for (int n = 0; n < 4; ++n) check(s.precisions[size_t(n)], w["precisions"][n], "precision " + std::to_string(n + 1));
    check(s.brevity_penalty, w["bp"], "bp");
    EXPECT_EQ(s.hypothesis_length, w["sys_len"].get<int64_t>()) << c.name;
    EXPECT_EQ(s.reference_length, w["ref_len"].get<int64_t>()) << c.name;
    std::printf("BLEU %-10s %3zu pairs: %8.4f (sacrebleu %8.4f), bp %.4f, lengths %lld / %lld\n", c.name.c_str(),
                c.hypotheses.size(), s.score, w["score"].get<double>(), s.brevity_penalty,
                (long long)s.hypothesis_length, (long long)s.reference_length);
  }
  std::printf("max |error| over scores, precisions and brevity penalties: %.3g\n", worst);
}

TEST(Bleu, BadInputIsAnError) {
  try {
    train::corpus_bleu({"a"}, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 hypotheses but 0 reference lists"), std::string::npos) << e.what();
  }
  try {
    train::corpus_bleu({"a"}, {{"", ""}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hypothesis 0 has no non-empty reference"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::testing
