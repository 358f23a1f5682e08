#pragma once
// LLaMA-family tokenizer.json files for tests, assembled from the format's documentation
// (no Hub download): a BPE vocabulary trained here on a corpus, SentencePiece style (spaces
// become "▁", words start with it), with the special tokens <unk> <s> </s>, optionally the
// 256 byte tokens <0x00>..<0xFF> for byte fallback, and each variant of the pipeline that
// Llama 2 / TinyLlama / Mistral uploads use.
#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace mt::test {

struct LlamaTokenizerStyle {
  std::string name;
  bool byte_tokens = true;         // <0xNN> tokens and byte_fallback (else unknown characters are <unk>)
  bool legacy_normalizer = true;   // normalizer Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer
  std::string prepend_scheme = "first";  // else: a Metaspace pre-tokenizer with this scheme...
  bool split = false;                    // ...and split
  bool fuse_unk = true;
  bool metaspace_decoder = false;  // decoder Metaspace instead of Sequence[Replace, ByteFallback, Fuse, Strip]
  bool chat_tokens = false;        // added tokens <|user|> (raw) and <|bot|> (normalized), not special
};

// The first `bytes` of Tiny Shakespeare (../shared/data), the corpus the fixtures train on.
std::string shakespeare_prefix(size_t bytes);

// Trains `num_merges` merges on the words of `corpus` and returns the tokenizer.json.
nlohmann::json llama_tokenizer_json(const std::string& corpus, const LlamaTokenizerStyle& style, size_t num_merges);

}  // namespace mt::test
