#include "meshtrain/train/caption_metrics.h"

#include <algorithm>

#include "meshtrain/core/error.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/train/bleu.h"
#include "meshtrain/train/rouge.h"

namespace mt::train {
namespace {

std::string strip(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

}  // namespace

std::string caption_text(const tokenizers::Tokenizer& tok, const std::vector<int64_t>& ids, int64_t eos_id,
                         int64_t pad_id) {
  std::vector<int32_t> keep;
  for (int64_t id : ids) {
    if (id == eos_id || id < 0) break;
    // Pad inside a caption only when pad is also a real token the model chose; ids past the
    // tokenizer's vocabulary (a model padded to a multiple of 64) have no text.
    if (id != pad_id && id < tok.vocab_size()) keep.push_back(int32_t(id));
  }
  return strip(tok.decode(keep, true));
}

std::map<std::string, double> caption_metrics(const std::vector<std::string>& predictions,
                                              const std::vector<std::vector<std::string>>& references) {
  MT_CHECK(!predictions.empty() && predictions.size() == references.size(), "[caption] ", predictions.size(),
           " captions for ", references.size(), " images");
  const BleuScore bleu = corpus_bleu(predictions, references);
  double rouge_l = 0;
  int64_t exact = 0;
  for (size_t i = 0; i < predictions.size(); ++i) {
    double best = 0;
    for (const std::string& ref : references[i]) best = std::max(best, rouge(ref, predictions[i]).rougeL.fmeasure);
    rouge_l += best;
    exact += std::any_of(references[i].begin(), references[i].end(),
                         [&](const std::string& ref) { return strip(ref) == strip(predictions[i]); });
  }
  const double n = double(predictions.size());
  return {{"bleu", bleu.score}, {"rougeL", rouge_l / n}, {"exact_match", double(exact) / n}};
}

}  // namespace mt::train
