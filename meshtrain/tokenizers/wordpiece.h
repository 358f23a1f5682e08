#pragma once
// BERT's tokenizer: the BertNormalizer (clean text, CJK spacing, accent stripping via NFD,
// lower-casing), the BertPreTokenizer (whitespace and punctuation splitting), the
// WordPiece model (greedy longest-match-first with "##" continuations, [UNK] for words it
// cannot cover or longer than max_input_chars_per_word) and the WordPiece decoder.
#include <optional>
#include <string>

#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/tokenizers/vocab.h"

namespace mt::tokenizers {

struct BertNormalizerOptions {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  std::optional<bool> strip_accents{};  // unset: follows lowercase
  bool lowercase = true;
};

struct WordPieceOptions {
  std::string unk_token = "[UNK]";
  std::string continuing_subword_prefix = "##";
  size_t max_input_chars_per_word = 100;
  std::optional<BertNormalizerOptions> normalizer = BertNormalizerOptions{};  // nullopt: no normalizer
  bool decoder = true;  // false: decode joins tokens with spaces (no decoder in tokenizer.json)
  std::string decoder_prefix = "##";
  bool decoder_cleanup = true;  // "a ." -> "a." and the like, per token
};

class WordPieceTokenizer : public Tokenizer {
 public:
  WordPieceTokenizer(Vocab vocab, WordPieceOptions options);
  std::string_view model_type() const override { return "WordPiece"; }
  const WordPieceOptions& options() const { return options_; }

  // The BertNormalizer alone; `src` receives, per output byte, the byte offset in `text`
  // of the character it came from.
  void normalize(std::string_view text, std::string& out, std::vector<uint32_t>& src) const;

 protected:
  void tokenize_segment(std::string_view text, int64_t base, int32_t type_id, int32_t sequence_id,
                        Encoding& out) const override;
  bool model_newline_cuts_are_exact() const override { return true; }
  std::string decode_tokens(const std::vector<int32_t>& ids, const std::vector<std::string_view>& tokens) const override;
  std::optional<int32_t> model_token_to_id(std::string_view token) const override { return vocab_.find(token); }
  const std::string* model_id_to_token(int32_t id) const override { return vocab_.token(id); }
  int64_t model_vocab_size() const override { return int64_t(vocab_.size()); }
  std::string normalize_for_matching(std::string_view content) const override;
  bool handles_normalized_added_tokens() const override { return options_.normalizer.has_value(); }

 private:
  void tokenize_normalized(std::string_view original, std::string_view norm, const std::vector<uint32_t>& src,
                           size_t begin, size_t end, int64_t base, int32_t type_id, int32_t sequence_id, Encoding& out) const;
  void wordpiece(std::string_view original, std::string_view norm, const std::vector<uint32_t>& src, size_t begin,
                 size_t end, int64_t base, int32_t type_id, int32_t sequence_id, Encoding& out) const;

  Vocab vocab_;
  WordPieceOptions options_;
  int32_t unk_id_ = -1;
  bool strip_accents_ = false;
};

// WordPiece from a BERT `vocab.txt` (one token per line, id = line number), with BERT's
// normalizer/pre-tokenizer/post-processor ([CLS] A [SEP] B [SEP]) and [PAD] [UNK] [CLS]
// [SEP] [MASK] as special tokens, like Hugging Face's BertWordPieceTokenizer.
// `lowercase` unset: lower-case unless the vocabulary is cased (see vocab_is_cased).
std::shared_ptr<WordPieceTokenizer> load_wordpiece_vocab(const std::string& path, std::optional<bool> lowercase,
                                                         std::optional<bool> strip_accents = std::nullopt,
                                                         bool handle_chinese_chars = true);
// True when a vocabulary has upper-case words (beyond bracketed special tokens): a cased model.
bool vocab_is_cased(const Vocab& vocab);

}  // namespace mt::tokenizers
