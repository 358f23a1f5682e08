#pragma once
// SentencePiece models (`.model` files: T5, LLaMA, ALBERT...) through libsentencepiece.
// Encoding and decoding are the library's own; this adapts them to the common interface
// (added tokens, templates, truncation, padding). Control symbols (</s>, <pad>) count as
// special for decode(skip_special_tokens).
#include <memory>
#include <string>

#include "meshtrain/tokenizers/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace mt::tokenizers {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;
  std::string_view model_type() const override { return "SentencePiece"; }
  const sentencepiece::SentencePieceProcessor& processor() const { return *sp_; }

 protected:
  void tokenize_segment(std::string_view text, int64_t base, int32_t type_id, int32_t sequence_id,
                        Encoding& out) const override;
  std::string decode_tokens(const std::vector<int32_t>& ids, const std::vector<std::string_view>& tokens) const override;
  std::optional<int32_t> model_token_to_id(std::string_view token) const override;
  const std::string* model_id_to_token(int32_t id) const override;
  int64_t model_vocab_size() const override;
  bool model_is_special(int32_t id) const override;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// Loads a .model with what Hugging Face's tokenizer class adds to it: for T5's layout
// (<pad> </s> <unk>, no <s>) the "$A </s>" template and `extra_ids` <extra_id_N> sentinels
// (load_tokenizer passes tokenizer_config.json's extra_ids beside the model, else 100);
// other models as they are.
std::shared_ptr<Tokenizer> load_sentencepiece(const std::string& model_path, int64_t extra_ids = 100);

}  // namespace mt::tokenizers
