// What Hugging Face's slow tokenizer classes add on top of a bare SentencePiece model.
// The .model file only holds the pieces; the end token T5 appends and its span-corruption
// sentinels live in the Python class (T5Tokenizer), so a loader of the bare file has to
// add them to give the ids HF gives.
#include <sentencepiece_processor.h>

#include "meshtrain/core/error.h"
#include "meshtrain/tokenizers/sentencepiece.h"

namespace mt::tokenizers {

namespace {

// T5's piece layout: <pad> 0, </s> 1, <unk> 2 and no <s>. LLaMA (<unk> <s> </s>) and
// ALBERT (<pad> <unk> [CLS] [SEP]) differ, so the layout alone identifies the family.
bool has_t5_layout(const sentencepiece::SentencePieceProcessor& sp) {
  return sp.GetPieceSize() > 3 && sp.IdToPiece(0) == "<pad>" && sp.IdToPiece(1) == "</s>" &&
         sp.IdToPiece(2) == "<unk>" && sp.PieceToId("<s>") == sp.unk_id();
}

}  // namespace

std::shared_ptr<Tokenizer> load_sentencepiece(const std::string& model_path, int64_t extra_ids) {
  auto tok = std::make_shared<SentencePieceTokenizer>(model_path);
  if (!has_t5_layout(tok->processor())) return tok;
  // T5Tokenizer: "$A </s>" and "$A </s> $B </s>", all of type 0.
  const auto eos = TemplateProcessing::SpecialToken{{1}, {"</s>"}};
  using Piece = TemplateProcessing::Piece;
  const Piece a{true, 0, "", 0}, b{true, 1, "", 0}, end{false, 0, "</s>", 0};
  tok->set_post_processor(TemplateProcessing({a, end}, {a, end, b, end}, {{"</s>", eos}}));
  // Sentinels count down from the top: <extra_id_0> is the last id, <extra_id_{n-1}> the
  // first past the model's pieces. Added highest-numbered first so each takes the next id.
  // They swallow the spaces around them (T5Tokenizer's lstrip/rstrip), which SentencePiece
  // would drop anyway.
  MT_CHECK(extra_ids >= 0, "[tokenizer] ", model_path, ": extra_ids must be >= 0, got ", extra_ids);
  std::vector<AddedToken> sentinels;
  for (int64_t i = extra_ids - 1; i >= 0; --i) {
    AddedToken t;
    t.content = "<extra_id_" + std::to_string(i) + ">";
    t.special = true;
    t.lstrip = t.rstrip = true;
    sentinels.push_back(std::move(t));
  }
  tok->add_tokens(std::move(sentinels));
  return tok;
}

}  // namespace mt::tokenizers
