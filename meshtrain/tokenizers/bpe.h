#pragma once
// Byte-level BPE (GPT-2, RoBERTa): the ByteLevel pre-tokenizer (GPT-2's split pattern,
// written by hand over Unicode categories, then bytes mapped to printable characters),
// the BPE model (merges applied lowest rank first) with a cache of recent words, and the
// ByteLevel decoder.
#include <array>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "meshtrain/tokenizers/bpe_merges.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/tokenizers/vocab.h"

namespace mt::tokenizers {

struct BpeOptions {
  bool add_prefix_space = false;  // prepend a space to each segment that lacks one
  bool use_regex = true;          // split with GPT-2's pattern before the byte mapping
  bool decoder = true;            // false: decode joins tokens with spaces
  size_t cache_capacity = 200000; // words remembered (0 disables the cache)
  std::string source = "merges";  // file name used in error messages
};

// GPT-2's bytes_to_unicode: the printable character standing for each byte in vocabularies.
std::array<uint32_t, 256> byte_to_codepoint();

// GPT-2's pre-tokenization pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// as byte ranges [begin, end) of `text`.
void gpt2_split(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& pieces);

class ByteLevelBpeTokenizer : public Tokenizer {
 public:
  ByteLevelBpeTokenizer(Vocab vocab, const std::vector<BpeMerge>& merges, BpeOptions options);
  std::string_view model_type() const override { return "BPE"; }
  size_t num_merges() const { return merges_.size(); }

 protected:
  void tokenize_segment(std::string_view text, int64_t base, int32_t type_id, int32_t sequence_id,
                        Encoding& out) const override;
  bool model_newline_cuts_are_exact() const override { return options_.use_regex && !options_.add_prefix_space; }
  std::string decode_tokens(const std::vector<int32_t>& ids, const std::vector<std::string_view>& tokens) const override;
  std::optional<int32_t> model_token_to_id(std::string_view token) const override { return vocab_.find(token); }
  const std::string* model_id_to_token(int32_t id) const override { return vocab_.token(id); }
  int64_t model_vocab_size() const override { return int64_t(vocab_.size()); }

 private:
  using Word = BpeWord;
  void bpe(std::string_view piece, Word& out) const;
  void encode_piece(std::string_view piece, Word& out) const;

  struct CacheShard {
    mutable std::shared_mutex mutex;
    std::unordered_map<std::string, Word, StringHash, std::equal_to<>> words;
  };

  Vocab vocab_;
  BpeOptions options_;
  std::array<int32_t, 256> byte_id_{};              // id of each byte's symbol (-1: not in vocab)
  std::array<std::string, 256> byte_char_;          // each byte's printable stand-in (UTF-8)
  std::unordered_map<uint32_t, uint8_t> char_byte_; // and back
  BpeMergeTable merges_;
  mutable std::array<CacheShard, 64> cache_;
};

// Reads a vocab.json/encoder.json (token -> id) and merges.txt/vocab.bpe; errors name the
// file and, for merges, the line.
Vocab read_bpe_vocab_json(const std::string& path);
std::vector<BpeMerge> read_bpe_merges(const std::string& path);
// GPT-2 style byte-level BPE from those two files, with <|endoftext|> special if present.
std::shared_ptr<ByteLevelBpeTokenizer> load_bpe_files(const std::string& vocab_path, const std::string& merges_path);

}  // namespace mt::tokenizers
