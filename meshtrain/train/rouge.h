#pragma once
// ROUGE with the semantics of Google's `rouge-score` package: text is lower-cased, every run
// of characters outside [a-z0-9] separates tokens, tokens longer than three letters are
// Porter-stemmed when asked; ROUGE-N counts clipped n-gram overlaps, ROUGE-L uses the
// longest common subsequence, ROUGE-Lsum the union LCS over newline-separated sentences
// (summary level). Scores are precision, recall and F-measure in [0, 1].
#include <string>
#include <string_view>
#include <vector>

namespace mt::train {

struct RougeScore {
  double precision = 0, recall = 0, fmeasure = 0;
};

struct RougeScores {
  RougeScore rouge1, rouge2, rougeL, rougeLsum;
};

// rouge-score's tokenizer (with its optional stemmer).
std::vector<std::string> rouge_tokenize(std::string_view text, bool use_stemmer);

// One prediction against one target.
RougeScores rouge(std::string_view target, std::string_view prediction, bool use_stemmer = false);
RougeScore rouge_n(const std::vector<std::string>& target, const std::vector<std::string>& prediction, int n);
RougeScore rouge_l(const std::vector<std::string>& target, const std::vector<std::string>& prediction);
RougeScore rouge_lsum(std::string_view target, std::string_view prediction, bool use_stemmer);

// The mean over pairs of each score (what summarization papers and HF's evaluate report as
// the aggregate without bootstrap). Throws mt::Error when the lists differ in length.
RougeScores mean_rouge(const std::vector<std::string>& targets, const std::vector<std::string>& predictions,
                       bool use_stemmer = false);

}  // namespace mt::train
