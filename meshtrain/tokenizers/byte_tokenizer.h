#pragma once
// A tokenizer whose ids are the bytes of the text (0..255) plus <|endoftext|> = 256: what a
// language model trained from scratch on any corpus can use with no tokenizer files at
// hand. It is stored as an ordinary GPT-2-style vocab.json + merges.txt (byte symbols, no
// merges), so the model directory it is saved into loads with any byte-level BPE reader.
#include <memory>
#include <string>

#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::tokenizers {

inline constexpr int32_t kByteTokenizerEndOfText = 256;

// Writes vocab.json and merges.txt into `dir` (created if needed).
void write_byte_tokenizer(const std::string& dir);

// The byte tokenizer, written to `dir` and loaded back from there.
std::shared_ptr<Tokenizer> make_byte_tokenizer(const std::string& dir);

}  // namespace mt::tokenizers
