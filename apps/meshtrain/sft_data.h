#pragma once
// Fine-tuning data for decoders: rows of a JSONL, CSV/TSV or text file turned into training
// sequences. Either causal LM on a text field (every token a target) or supervised
// fine-tuning on prompt/response pairs, where only the response tokens (and the end-of-text
// token after them) are targets: the template's prompt part is context, never predicted.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "meshtrain/data/dataset.h"
#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::cli {

struct SftFlags {
  std::string data;
  std::string text_field;      // causal LM on this field (default "text" when no prompt field)
  std::string prompt_field;    // SFT: the prompt's field ...
  std::string response_field;  // ... and the response's
  std::string template_text = "{prompt}{response}";
  int64_t seq_len = 128;
  bool packing = false;        // concatenate examples into full sequences instead of padding each
  bool pad_to_max_length = false;  // unpacked rows: every batch seq_len long, not cut after its last target
  // lm_collate's pad multiple: each batch cut after its last target (a multiple of 8), unless
  // rows are packed (full anyway) or --pad-to-max-length.
  int64_t pad_multiple() const { return packing || pad_to_max_length ? 0 : 8; }
  double eval_fraction = 0.1;  // the file's last rows, held out
};

void add_sft_data_flags(CLI::App* cmd, SftFlags& flags);

// One row's tokens and which of them are targets.
struct SftRecord {
  std::vector<int64_t> tokens;
  size_t prompt_tokens = 0;  // the first prompt_tokens are context only
};

struct SftCorpus {
  // Examples {"tokens": seq_len + 1 ids, "targets": seq_len + 1 ids (-100: not a target)}.
  std::shared_ptr<const data::Dataset> train, eval;
  int64_t rows = 0, eval_rows = 0;
  int64_t truncated = 0;       // rows longer than a sequence, cut
  int64_t target_tokens = 0;   // over train and eval
  bool supervised = false;     // prompt/response pairs (else text)
  std::vector<std::string> eval_prompts, eval_responses;  // the held-out rows' template prompt and response
};

// The rows of --data as records: a JSONL/CSV/TSV row without a named field is an error
// naming the file, the line and the field; an empty file or template without {response}
// (in SFT) is an error too.
SftCorpus make_sft_corpus(const SftFlags& flags, const tokenizers::Tokenizer& tok, std::optional<int64_t> eos_id);

// The template's text before the response, with the prompt filled in ("Q: 2+3\nA: ").
std::string prompt_text(const std::string& template_text, const std::string& prompt);

}  // namespace mt::cli
