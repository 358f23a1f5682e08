#pragma once
// The common tokenizer interface. A tokenizer runs Hugging Face's pipeline: added tokens
// are split out, each remaining segment is normalized, pre-tokenized and run through the
// model (WordPiece, byte-level BPE, SentencePiece), then the post-processor adds special
// tokens, and truncation and padding shape the result. Ids match Hugging Face `tokenizers`.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meshtrain/tokenizers/added_vocabulary.h"
#include "meshtrain/tokenizers/encoding.h"

namespace mt::tokenizers {

// encode*/decode are const and safe to call from many threads at once; the setters are not.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  Encoding encode(std::string_view text, bool add_special_tokens = true) const;
  Encoding encode_pair(std::string_view a, std::string_view b, bool add_special_tokens = true) const;
  // On all cores (OpenMP); padding to the longest applies across the batch.
  std::vector<Encoding> encode_batch(std::span<const std::string> texts, bool add_special_tokens = true) const;
  std::vector<Encoding> encode_batch(std::span<const std::pair<std::string, std::string>> pairs,
                                     bool add_special_tokens = true) const;

  // Special tokens (added tokens marked special) are dropped when skip_special_tokens.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  // Number of distinct ids: the model's vocabulary plus added tokens outside it.
  int64_t vocab_size() const;
  bool is_special(int32_t id) const { return added_.is_special_id(id) || model_is_special(id); }
  virtual std::string_view model_type() const = 0;  // "WordPiece", "BPE", "SentencePiece"
  // Whether text cut just after a lone newline between an ASCII non-space character and an
  // ASCII letter or digit ("...x\nY...") encodes, piece by piece, to the ids of the whole text:
  // the model must claim it (model_newline_cuts_are_exact) and no added token may reach across
  // such a newline (one that swallows whitespace on its left, or contains a newline).
  // prepare-data cuts long documents only when this holds.
  bool newline_cuts_are_exact() const;

  void set_truncation(std::optional<TruncationParams> params);
  void set_padding(std::optional<PaddingParams> params);
  void set_post_processor(TemplateProcessing processor) { post_ = std::move(processor); }
  const std::optional<TruncationParams>& truncation() const { return truncation_; }
  const std::optional<PaddingParams>& padding() const { return padding_; }
  const TemplateProcessing& post_processor() const { return post_; }

  // Adds tokens matched whole in the input; a content already in the vocabulary keeps
  // its id, a new one gets the next free id.
  void add_tokens(std::vector<AddedToken> tokens);
  // Adds special tokens (skipped by decode); contents already in the vocabulary keep their id.
  void add_special_tokens(const std::vector<std::string>& contents);
  const AddedVocabulary& added_vocabulary() const { return added_; }

 protected:
  // Tokenizes one segment free of added tokens. `text` is the segment; offsets pushed to
  // `out` are `base` + byte offsets within it.
  virtual void tokenize_segment(std::string_view text, int64_t base, int32_t type_id, int32_t sequence_id,
                                Encoding& out) const = 0;
  // Turns the kept tokens back into text (the decoder).
  virtual std::string decode_tokens(const std::vector<int32_t>& ids, const std::vector<std::string_view>& tokens) const = 0;
  virtual std::optional<int32_t> model_token_to_id(std::string_view token) const = 0;
  virtual const std::string* model_id_to_token(int32_t id) const = 0;
  virtual int64_t model_vocab_size() const = 0;
  // The model's part of newline_cuts_are_exact: true for WordPiece and for byte-level BPE with
  // GPT-2's split and no prefix space (a newline always ends a pre-token there); false where a
  // piece's start is treated specially (SentencePiece's dummy prefix).
  virtual bool model_newline_cuts_are_exact() const { return false; }
  // Model tokens that decode skips like special tokens (SentencePiece control symbols).
  virtual bool model_is_special(int32_t id) const { return false; }
  // The normalizer applied to an added token's content (identity by default).
  virtual std::string normalize_for_matching(std::string_view content) const { return std::string(content); }
  // True when the subclass splits normalized added tokens itself (inside tokenize_segment);
  // otherwise they are matched on the raw text, which is the same when no normalizer runs.
  virtual bool handles_normalized_added_tokens() const { return false; }

  Encoding encode_sequence(std::string_view text, int32_t type_id, int32_t sequence_id) const;
  Encoding post_process(Encoding a, std::optional<Encoding> b, bool add_special_tokens) const;

  AddedVocabulary added_;
  TemplateProcessing post_;
  std::optional<TruncationParams> truncation_;
  std::optional<PaddingParams> padding_;
};

// Loads a tokenizer from a `tokenizer.json` file, a `vocab.txt` (WordPiece), a
// SentencePiece `.model`, or a directory holding one of: tokenizer.json, vocab.txt,
// vocab.json + merges.txt, encoder.json + vocab.bpe, *.model. Throws mt::Error naming the
// file and the problem for anything malformed.
struct LoadOptions {
  // WordPiece from vocab.txt: lower-case the input? Unset: tokenizer_config.json's
  // do_lower_case if present, else true unless the vocabulary has upper-case words.
  std::optional<bool> lowercase{};
};
std::shared_ptr<Tokenizer> load_tokenizer(const std::string& path, const LoadOptions& options = {});

// Copies the files of the tokenizer at `path` (anything load_tokenizer takes) into `dir`
// under the standard names (tokenizer.json, vocab.txt, vocab.json + merges.txt,
// tokenizer.model), so load_tokenizer(dir) loads the same tokenizer.
void copy_tokenizer_files(const std::string& path, const std::string& dir);

}  // namespace mt::tokenizers
