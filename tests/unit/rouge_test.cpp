// ROUGE against values computed by hand and rouge-score's published README example, and the
// Porter stemmer against the examples of Porter's 1980 paper.
#include <gtest/gtest.h>

#include "meshtrain/train/porter_stemmer.h"
#include "meshtrain/train/rouge.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

using namespace mt::train;

TEST(PorterStemmer, ThePapersExamples) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"caresses", "caress"}, {"ponies", "poni"}, {"ties", "ti"}, {"caress", "caress"}, {"cats", "cat"},
      {"feed", "feed"}, {"agreed", "agre"}, {"plastered", "plaster"}, {"bled", "bled"}, {"motoring", "motor"},
      {"sing", "sing"}, {"conflated", "conflat"}, {"troubled", "troubl"}, {"sized", "size"}, {"hopping", "hop"},
      {"tanned", "tan"}, {"falling", "fall"}, {"hissing", "hiss"}, {"fizzed", "fizz"}, {"failing", "fail"},
      {"filing", "file"}, {"happy", "happi"}, {"sky", "sky"}, {"relational", "relat"}, {"conditional", "condit"},
      {"rational", "ration"}, {"valenci", "valenc"}, {"hesitanci", "hesit"}, {"digitizer", "digit"},
      {"conformabli", "conform"}, {"radicalli", "radic"}, {"differentli", "differ"}, {"vileli", "vile"},
      {"analogousli", "analog"}, {"vietnamization", "vietnam"}, {"predication", "predic"}, {"operator", "oper"},
      {"feudalism", "feudal"}, {"decisiveness", "decis"}, {"hopefulness", "hope"}, {"callousness", "callous"},
      {"formaliti", "formal"}, {"sensitiviti", "sensit"}, {"sensibiliti", "sensibl"}, {"triplicate", "triplic"},
      {"formative", "form"}, {"formalize", "formal"}, {"electriciti", "electr"}, {"electrical", "electr"},
      {"hopeful", "hope"}, {"goodness", "good"}, {"revival", "reviv"}, {"allowance", "allow"},
      {"inference", "infer"}, {"airliner", "airlin"}, {"gyroscopic", "gyroscop"}, {"adjustable", "adjust"},
      {"defensible", "defens"}, {"irritant", "irrit"}, {"replacement", "replac"}, {"adjustment", "adjust"},
      {"dependent", "depend"}, {"adoption", "adopt"}, {"homologou", "homolog"}, {"communism", "commun"},
      {"activate", "activ"}, {"angulariti", "angular"}, {"homologous", "homolog"}, {"effective", "effect"},
      {"bowdlerize", "bowdler"}, {"probate", "probat"}, {"rate", "rate"}, {"cease", "ceas"},
      {"controlling", "control"}, {"roll", "roll"}, {"generalizations", "gener"}, {"oscillators", "oscil"}};
  for (const auto& [word, stem] : cases) EXPECT_EQ(porter_stem(word), stem) << word;
}

void expect_score(const RougeScore& s, double p, double r, double f, const char* what) {
  EXPECT_NEAR(s.precision, p, 1e-12) << what;
  EXPECT_NEAR(s.recall, r, 1e-12) << what;
  EXPECT_NEAR(s.fmeasure, f, 1e-12) << what;
}

TEST(Rouge, TheRougeScoreReadmeExample) {
  // rouge-score's README: RougeScorer(['rouge1', 'rougeL'], use_stemmer=True).
  const RougeScores s = rouge("The quick brown fox jumps over the lazy dog", "The quick brown dog jumps on the log.", true);
  expect_score(s.rouge1, 0.75, 6.0 / 9.0, 0.7058823529411765, "rouge1");
  expect_score(s.rougeL, 0.625, 5.0 / 9.0, 0.5882352941176471, "rougeL");
  // rouge2 by hand: target bigrams 8, prediction 7, shared: "the quick", "quick brown", "dog jump"? no —
  // (the quick), (quick brown) only.
  expect_score(s.rouge2, 2.0 / 7.0, 2.0 / 8.0, 2 * (2.0 / 7) * (2.0 / 8) / (2.0 / 7 + 2.0 / 8), "rouge2");
}

TEST(Rouge, TokenizationAndClippedCounts) {
  EXPECT_EQ(rouge_tokenize("Hello, WORLD!! it's 2024-11-24 café", false),
            (std::vector<std::string>{"hello", "world", "it", "s", "2024", "11", "24", "caf"}));
  EXPECT_EQ(rouge_tokenize("The runners were running", true), (std::vector<std::string>{"the", "runner", "were", "run"}));
  // "the the the" against "the cat": the prediction's "the" matches once (clipped).
  expect_score(rouge("the cat", "the the the").rouge1, 1.0 / 3.0, 0.5, 0.4, "clipped");
  expect_score(rouge("", "anything").rouge1, 0, 0, 0, "empty target");
  expect_score(rouge("a b", "").rougeL, 0, 0, 0, "empty prediction");
  expect_score(rouge("same words here", "same words here").rouge2, 1, 1, 1, "identical");
}

TEST(Rouge, SummaryLevelLcsOverSentences) {
  // Worked by hand (see rouge.cpp's union LCS): sentence boundaries cost one hit.
  const RougeScores s = rouge("the cat sat\non the mat", "the cat\nsat on the mat");
  expect_score(s.rougeL, 1, 1, 1, "rougeL ignores newlines");
  expect_score(s.rougeLsum, 5.0 / 6.0, 5.0 / 6.0, 5.0 / 6.0, "rougeLsum");
  // Empty lines are not sentences.
  expect_score(rouge("a b c\n\n", "a b c").rougeLsum, 1, 1, 1, "blank lines");
}

TEST(Rouge, MeanOverPairs) {
  const RougeScores m = mean_rouge({"hello there", "general kenobi"}, {"hello there", "general grievous"});
  expect_score(m.rouge1, 0.75, 0.75, 0.75, "mean rouge1");
  expect_score(m.rouge2, 0.5, 0.5, 0.5, "mean rouge2");
  expect_error([] { mean_rouge({"a"}, {}); }, {"1 targets but 0 predictions"});
}

}  // namespace
}  // namespace mt::testing
