#pragma once
// Added tokens (special tokens like [CLS] or <|endoftext|>, and user-added words): they are
// found in the text and split out before normalization and pre-tokenization, as in
// Hugging Face `tokenizers` (leftmost-longest matching; single_word, lstrip, rstrip).
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace mt::tokenizers {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool normalized = false;  // matched against the normalized text instead of the raw text
  bool lstrip = false;      // swallows whitespace on its left
  bool rstrip = false;      // swallows whitespace on its right
  bool single_word = false; // only matches when not inside a word
};

// One piece of a split text: [begin, end) in the text, and the added token id or -1.
struct Split {
  size_t begin = 0, end = 0;
  int32_t id = -1;
};

class AddedVocabulary {
 public:
  // Registers a token (replacing one with the same content). `normalized_pattern` is the
  // token's content after the tokenizer's normalizer (for tokens with normalized=true).
  void add(AddedToken token, std::string normalized_pattern);
  bool empty() const { return tokens_.empty(); }
  size_t size() const { return tokens_.size(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

  std::optional<int32_t> token_to_id(std::string_view content) const;
  const AddedToken* find_id(int32_t id) const;
  // The token's string as HF reports it (id_to_token, decode, encoding tokens): the content
  // after the normalizer for normalized tokens, else the content. Requires a known id.
  const std::string& token_string(int32_t id) const;
  bool is_special_id(int32_t id) const { return special_ids_.count(id) > 0; }

  // Splits `text` on the tokens matched on raw (normalized=false) or normalized text.
  void split(std::string_view text, bool normalized_pass, std::vector<Split>& out) const;
  bool has_pass(bool normalized_pass) const { return !pass_[normalized_pass ? 1 : 0].patterns.empty(); }
  // Without a normalizer, normalized tokens are matched on the raw text with the rest.
  void set_normalized_pass(bool enabled);

 private:
  struct Pass {
    std::vector<std::pair<std::string, size_t>> patterns;  // (pattern, index into tokens_)
    std::array<std::vector<uint32_t>, 256> by_first_byte;  // pattern indices, longest first
  };
  void rebuild();

  std::vector<AddedToken> tokens_;
  std::vector<std::string> normalized_patterns_;
  std::unordered_map<std::string, size_t> by_content_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_set<int32_t> special_ids_;
  bool normalized_pass_ = true;
  Pass pass_[2];
};

}  // namespace mt::tokenizers
