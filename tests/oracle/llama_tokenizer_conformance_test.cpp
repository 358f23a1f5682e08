// LLaMA-family tokenizer.json files (SentencePiece-style BPE with byte fallback, as in Llama 2,
// TinyLlama and Mistral uploads) against Hugging Face `tokenizers`: ids, type ids and decoded
// text identical on the Unicode edge cases and on the whole conformance corpus, for each form
// of the pipeline (legacy Prepend/Replace normalizer; Metaspace pre-tokenizer with each
// prepend scheme, split or not; Metaspace decoder) and for vocabularies with and without
// byte tokens. The files are assembled here (tests/support/llama_tokenizer_fixture.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "meshtrain/core/error.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "tests/support/llama_tokenizer_fixture.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tokenizer_oracle.h"

namespace mt::tokenizers {
namespace {

namespace fs = std::filesystem;
using test::LlamaTokenizerStyle;
using test::TextInput;

const std::string& corpus() {
  static const std::string text = test::shakespeare_prefix(300000);
  return text;
}

std::string write_style(const fs::path& dir, const LlamaTokenizerStyle& style) {
  const fs::path path = dir / (style.name + ".json");
  std::ofstream(path) << test::llama_tokenizer_json(corpus(), style, 600).dump();
  return path.string();
}

// Inputs that exercise the metaspace handling in particular, on top of the shared edge cases.
std::vector<TextInput> metaspace_cases() {
  std::vector<TextInput> in = test::edge_cases();
  for (const char* s : {"Once upon a time", " Once upon a time", "Once  upon   a time  ", "\nOnce\n upon\n",
                        "<s>Once upon</s> a time<s>", "Hello <s> world", "a<|user|>b <|user|> c<|bot|>d <|bot|> e",
                        "<|bot|>at the start", "\xE2\x96\x81" "already\xE2\x96\x81" "metaspace \xE2\x96\x81", "\xC3\xA9t\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87",
                        "digits 0123456789 and 3.14", "tab\there"})
    in.push_back({s, std::nullopt});
  in.push_back({"First sentence.", " second sentence "});
  return in;
}

const std::vector<LlamaTokenizerStyle>& styles() {
  static const std::vector<LlamaTokenizerStyle> s = [] {
    std::vector<LlamaTokenizerStyle> v;
    v.push_back({.name = "legacy_normalizer_bytes", .chat_tokens = true});
    v.push_back({.name = "metaspace_first_bytes", .legacy_normalizer = false});
    v.push_back({.name = "metaspace_always_split", .legacy_normalizer = false, .prepend_scheme = "always", .split = true,
                 .metaspace_decoder = true});
    v.push_back({.name = "metaspace_never_split_chat", .legacy_normalizer = false, .prepend_scheme = "never",
                 .split = true, .chat_tokens = true});
    v.push_back({.name = "legacy_no_bytes_fused_unk", .byte_tokens = false});
    v.push_back({.name = "metaspace_no_bytes_unfused_unk", .byte_tokens = false, .legacy_normalizer = false,
                 .fuse_unk = false});
    return v;
  }();
  return s;
}

class LlamaTokenizerConformance : public mt::testing::TempDir {};

TEST_F(LlamaTokenizerConformance, EdgeCasesEveryStyle) {
  const auto inputs = metaspace_cases();
  for (const auto& style : styles()) {
    const std::string path = write_style(dir_, style);
    auto tok = load_tokenizer(path);
    EXPECT_EQ(tok->model_type(), "BPE");
    test::compare("edge cases " + style.name, *tok, inputs, test::run_oracle("--json " + path + " --decode", inputs));
    test::compare("edge cases " + style.name + " without special tokens", *tok, inputs,
                  test::run_oracle("--json " + path + " --decode --no-special", inputs), false, false);
  }
}

// The two forms real uploads use, on every GLUE sentence/pair and Tiny Shakespeare line; and
// decode(encode(s)) == s wherever Hugging Face's round trip holds.
TEST_F(LlamaTokenizerConformance, FullCorpusRealForms) {
  const auto& inputs = test::all_inputs();
  for (size_t k : {0u, 1u}) {
    const LlamaTokenizerStyle& style = styles()[k];
    const std::string path = write_style(dir_, style);
    auto tok = load_tokenizer(path);
    const auto expected = test::run_oracle("--json " + path + " --decode-every 7", inputs);
    test::compare("corpus " + style.name, *tok, inputs, expected);
    size_t hf_round = 0, ours_round = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].b || !expected[i].has_decoded || expected[i].decoded != inputs[i].a) continue;
      ++hf_round;
      const Encoding e = tok->encode(inputs[i].a);
      ours_round += tok->decode(e.ids) == inputs[i].a;
    }
    std::cout << "[round trip] " << style.name << ": decode(encode(s)) == s for " << ours_round << " of the " << hf_round
              << " inputs where Hugging Face's holds\n";
    EXPECT_GT(hf_round, 1000u);
    EXPECT_EQ(ours_round, hf_round);
  }
}

}  // namespace
}  // namespace mt::tokenizers
