#pragma once
// Corpus BLEU with sacrebleu's semantics (its defaults: the "13a" tokenizer of mteval-v13a,
// case kept, n-grams up to 4, clipped counts against the most of each n-gram in any reference,
// the brevity penalty from each hypothesis' closest reference length (the shorter on a tie),
// "exp" smoothing of zero n-gram matches). Any number of references per hypothesis (COCO has
// about five per image); empty ones are skipped. Scores are 0..100 as sacrebleu prints them.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mt::train {

struct BleuScore {
  double score = 0;                      // BLEU-4
  std::array<double, 4> precisions{};    // n-gram precisions, 0..100 (smoothed where zero)
  double brevity_penalty = 0;
  int64_t hypothesis_length = 0, reference_length = 0;
};

// The mteval-v13a tokenization, as sacrebleu's Tokenizer13a (ASCII whitespace splits tokens).
std::string tokenize_13a(std::string_view line);

// hypotheses[i] against references[i] (one or more strings). Throws mt::Error when the lists
// differ in length or a hypothesis has no non-empty reference.
BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::vector<std::string>>& references);

}  // namespace mt::train
