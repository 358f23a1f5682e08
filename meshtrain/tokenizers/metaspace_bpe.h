#pragma once
// BPE over SentencePiece-style text, where a space is the metaspace character "▁" (U+2581):
// the tokenizer.json of LLaMA, Llama 2, TinyLlama, Mistral and most small LLaMA uploads.
// The pipeline follows Hugging Face `tokenizers`:
//   normalizer     Prepend("▁") and Replace(" ", "▁") (the legacy Llama form), or none
//   pre-tokenizer  Metaspace (replacement, prepend_scheme always/first/never, split), or none:
//                  then the whole segment is one word
//   model          BPE on characters; a character outside the vocabulary becomes its UTF-8
//                  bytes as <0xNN> tokens (byte_fallback), else the unknown token, fused
//                  with its neighbours when fuse_unk
//   decoder        a DecoderChain (Replace, ByteFallback, Fuse, Strip, Metaspace)
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/tokenizers/bpe_merges.h"
#include "meshtrain/tokenizers/decoder_chain.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/tokenizers/vocab.h"

namespace mt::tokenizers {

// One normalizer step: Prepend(content) when `prepend`, else Replace(pattern, content).
struct NormalizeStep {
  bool prepend = false;
  std::string pattern, content;
};

enum class PrependScheme { always, first, never };

struct MetaspaceOptions {
  std::string replacement = "\xE2\x96\x81";
  PrependScheme prepend_scheme = PrependScheme::always;
  bool split = true;  // split into words before each replacement character
};

struct MetaspaceBpeOptions {
  std::vector<NormalizeStep> normalizer;
  std::optional<MetaspaceOptions> metaspace;  // the pre-tokenizer (none: one word per segment)
  std::optional<std::string> unk_token;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is a vocabulary token is taken whole
  DecoderChain decoder;        // empty: tokens joined with spaces
  std::string source = "tokenizer.json";  // for error messages
};

class MetaspaceBpeTokenizer : public Tokenizer {
 public:
  MetaspaceBpeTokenizer(Vocab vocab, const std::vector<BpeMerge>& merges, MetaspaceBpeOptions options);
  std::string_view model_type() const override { return "BPE"; }
  size_t num_merges() const { return merges_.size(); }

 protected:
  void tokenize_segment(std::string_view text, int64_t base, int32_t type_id, int32_t sequence_id,
                        Encoding& out) const override;
  std::string decode_tokens(const std::vector<int32_t>& ids, const std::vector<std::string_view>& tokens) const override;
  std::optional<int32_t> model_token_to_id(std::string_view token) const override { return vocab_.find(token); }
  const std::string* model_id_to_token(int32_t id) const override { return vocab_.token(id); }
  int64_t model_vocab_size() const override { return int64_t(vocab_.size()); }
  std::string normalize_for_matching(std::string_view content) const override;
  bool handles_normalized_added_tokens() const override { return !options_.normalizer.empty(); }

 private:
  // Text after a step, with each byte's source range [begin[i], end[i]) in the segment.
  struct Aligned {
    std::string text;
    std::vector<uint32_t> begin, end;
    void prepend(std::string_view s);  // aligned with the first character
    void replace(std::string_view pattern, std::string_view content);  // aligned with what it replaces
  };
  void normalize(std::string_view text, Aligned& out) const;
  // Pre-tokenizes and encodes norm.text[from, to) (a piece free of added tokens).
  void encode_piece(const Aligned& norm, size_t from, size_t to, int64_t base, int32_t type_id, int32_t sequence_id,
                    Encoding& out) const;
  // The BPE model on one word.
  void encode_word(std::string_view word, BpeWord& out) const;

  Vocab vocab_;
  BpeMergeTable merges_;
  MetaspaceBpeOptions options_;
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> byte_token_id_{};  // id of "<0xNN>" (-1: absent)
};

// The tokenizer a tokenizer.json describes with a BPE model and no ByteLevel pre-tokenizer,
// from its parts (null where absent). Anything outside the pipeline above is an error
// naming `path` and the key.
std::shared_ptr<MetaspaceBpeTokenizer> metaspace_bpe_from_json(const std::string& path, const nlohmann::json& model,
                                                               const nlohmann::json& normalizer,
                                                               const nlohmann::json& pre_tokenizer,
                                                               const nlohmann::json& decoder, Vocab vocab,
                                                               const std::vector<BpeMerge>& merges);

}  // namespace mt::tokenizers
