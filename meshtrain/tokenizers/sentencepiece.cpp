#include "meshtrain/tokenizers/sentencepiece.h"

#include <sentencepiece_processor.h>

#include "meshtrain/core/error.h"

namespace mt::tokenizers {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto status = sp_->Load(model_path);
  MT_CHECK(status.ok(), "[tokenizer] ", model_path, ": not a valid SentencePiece model (", status.ToString(), ")");
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::tokenize_segment(std::string_view text, int64_t base, int32_t type_id,
                                              int32_t sequence_id, Encoding& out) const {
  if (text.empty()) return;
  const auto spt = sp_->EncodeAsImmutableProto(absl::string_view(text.data(), text.size()));
  for (size_t i = 0; i < spt.pieces_size(); ++i) {
    const auto p = spt.pieces(int(i));
    out.push_back(int32_t(p.id()), p.piece(), {base + p.begin(), base + p.end()}, type_id, sequence_id, false);
  }
}

std::string SentencePieceTokenizer::decode_tokens(const std::vector<int32_t>& ids,
                                                  const std::vector<std::string_view>& tokens) const {
  // The library drops control symbols; kept ones (skip_special_tokens=false) are spliced
  // in as their piece text between decoded runs.
  std::string out;
  std::vector<int> run;
  auto flush = [&] {
    if (!run.empty()) out += sp_->DecodeIds(run);
    run.clear();
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    if (model_is_special(ids[i]) || ids[i] >= sp_->GetPieceSize()) {
      flush();
      out += tokens[i];
    } else {
      run.push_back(ids[i]);
    }
  }
  flush();
  return out;
}

std::optional<int32_t> SentencePieceTokenizer::model_token_to_id(std::string_view token) const {
  const int id = sp_->PieceToId(absl::string_view(token.data(), token.size()));
  if (id < 0 || sp_->IdToPiece(id) != token) return std::nullopt;
  return id;
}

const std::string* SentencePieceTokenizer::model_id_to_token(int32_t id) const {
  if (id < 0 || id >= sp_->GetPieceSize()) return nullptr;
  return &sp_->IdToPiece(id);
}

int64_t SentencePieceTokenizer::model_vocab_size() const { return sp_->GetPieceSize(); }

bool SentencePieceTokenizer::model_is_special(int32_t id) const {
  return id >= 0 && id < sp_->GetPieceSize() && sp_->IsControl(id);
}

}  // namespace mt::tokenizers
