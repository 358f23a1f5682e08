#pragma once
// How a captioner is scored and read back: the captions as text (token ids cut at the end
// token, special tokens dropped, spaces trimmed), and corpus BLEU-4 as sacrebleu computes it
// against every reference of an image, ROUGE-L (the best over an image's references, averaged)
// and exact match (the caption equals one of the references). `meshtrain caption` and
// `meshtrain eval` report the same numbers through these.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mt::tokenizers {
class Tokenizer;
}

namespace mt::train {

// A generated row (ids after the start token; -1 or pad after the end) as caption text.
std::string caption_text(const tokenizers::Tokenizer& tok, const std::vector<int64_t>& ids, int64_t eos_id,
                         int64_t pad_id);

// {"bleu", "rougeL", "exact_match"} of predictions[i] against references[i] (one or more).
std::map<std::string, double> caption_metrics(const std::vector<std::string>& predictions,
                                              const std::vector<std::vector<std::string>>& references);

}  // namespace mt::train
