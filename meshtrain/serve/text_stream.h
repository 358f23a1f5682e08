#pragma once
// One choice's generated tokens turned into text as they arrive. Text is released only once
// it can no longer change: an incomplete UTF-8 character (a byte-level token that splits
// one) and a tail that might begin a stop string are held back. The text ends before the
// first stop string; the caller then stops the choice.
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::serve {

class TextStream {
 public:
  // `context`: the prompt's last few tokens, decoded before the new ones so that decoders
  // which treat the first token specially (SentencePiece's leading space) see the middle of
  // a text, as they do in `generate`.
  TextStream(const tokenizers::Tokenizer& tokenizer, const std::vector<int64_t>& prompt, std::vector<std::string> stops);

  // Adds a generated token; returns the text that became final with it.
  std::string push(int64_t token);
  // Generation ended: returns what was held back (none of it past a stop string).
  std::string finish();

  bool stopped() const { return stopped_; }  // the text reached a stop string
  const std::string& released() const { return released_; }

 private:
  // The text of every token pushed so far: the settled text, then what the tokens after it
  // decode to (read with a few tokens of context, so a token costs the unsettled tail only,
  // not the whole text).
  std::string decoded() const;
  std::string release_up_to(size_t end, const std::string& text);

  const tokenizers::Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;  // context + generated
  size_t stable_ = 0;          // ids_[..stable_) decode to settled_ (no incomplete character at its end)
  std::string settled_;        // the generated text up to stable_
  std::vector<std::string> stops_;
  size_t longest_stop_ = 0;
  std::string released_;
  bool stopped_ = false;
};

// The text of one token alone (for logprobs' token strings).
std::string token_text(const tokenizers::Tokenizer& tokenizer, int64_t token);

}  // namespace mt::serve
