// Tokenizer conformance: our tokenizers against Hugging Face `tokenizers` (PyPI, installed
// by scripts/install-python-deps.sh; tests/python/hf_encode.py) on every GLUE
// sentence/pair and every Tiny Shakespeare line, plus truncation, padding, added tokens
// and Unicode edge cases. SentencePiece is checked against libsentencepiece itself.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <unordered_map>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "meshtrain/core/error.h"
#include "meshtrain/tokenizers/bpe.h"
#include "meshtrain/tokenizers/sentencepiece.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/tokenizers/wordpiece.h"
#include "tests/support/tokenizer_inputs.h"
#include "tests/support/tokenizer_oracle.h"

namespace mt::tokenizers {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::TextInput;
using test::all_inputs;
using test::compare;
using test::edge_cases;
using test::ids_str;
using test::Result;
using test::run_oracle;
using test::seconds_since;

const std::string kData = MT_DATA_DIR;
const std::string kBertJson = kData + "/tokenizers/bert-base-uncased-tokenizer.json";
const std::string kBertCasedVocab = kData + "/tokenizers/bert-base-cased-vocab.txt";
const std::string kBertUncasedVocab = kData + "/tokenizers/bert-base-uncased-vocab.txt";
const std::string kGpt2Json = kData + "/models/hf-tiny-gpt2/tokenizer.json";
const std::string kGpt2Encoder = kData + "/tokenizers/gpt2-encoder.json";
const std::string kGpt2Bpe = kData + "/tokenizers/gpt2-vocab.bpe";
const std::string kT5Model = kData + "/tokenizers/t5-spiece.model";

// each comparison starts as soon as its oracle is done.
TEST(TokenizerConformance, FullCorpus) {
  const auto& inputs = all_inputs();
  struct Config {
    std::string label, path, oracle_args;
    int64_t vocab_size;
    std::string model_type;
  };
  const std::vector<Config> configs = {
      {"bert-base-uncased tokenizer.json", kBertJson, "--json " + kBertJson, 30522, "WordPiece"},
      // A cased vocabulary (upper-case words) loads without lower-casing.
      {"bert-base-cased vocab.txt", kBertCasedVocab, "--wordpiece " + kBertCasedVocab + " --lowercase 0", 28996,
       "WordPiece"},
      {"gpt2 tokenizer.json", kGpt2Json, "--json " + kGpt2Json, 50257, "BPE"},
      // encoder.json finds gpt2-vocab.bpe beside it.
      {"gpt2 encoder.json+vocab.bpe", kGpt2Encoder, "--bpe " + kGpt2Encoder + " " + kGpt2Bpe, 50257, "BPE"},
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::future<std::vector<Result>>> oracles;
  for (const auto& c : configs)
    oracles.push_back(std::async(std::launch::async, run_oracle, c.oracle_args + " --decode-every 4 --no-mask",
                                 std::cref(inputs)));
  for (size_t k = 0; k < configs.size(); ++k) {
    auto tok = load_tokenizer(configs[k].path);
    EXPECT_EQ(tok->model_type(), configs[k].model_type);
    EXPECT_EQ(tok->vocab_size(), configs[k].vocab_size);
    const auto expected = oracles[k].get();
    std::cout << "[conformance] " << configs[k].label << ": oracle done after " << seconds_since(t0) << " s\n";
    compare(configs[k].label, *tok, inputs, expected);
  }
}

// Truncation strategies, padding and special-token switches on the MRPC pairs and the
// CoLA sentences (fewer inputs: the oracle reruns for each setting).
std::vector<TextInput> subset(bool pairs, size_t n) {
  std::vector<TextInput> out;
  for (const auto& x : all_inputs())
    if (x.b.has_value() == pairs && out.size() < n) out.push_back(x);
  return out;
}

struct Setting {
  std::string args;
  std::optional<TruncationParams> trunc;
  std::optional<PaddingParams> pad;
  bool batch = false;
  bool add_special = true;
  bool odd_split = false;
};

void run_settings(const std::string& name, Tokenizer& tok, const std::string& spec, const std::vector<Setting>& settings,
                  const std::vector<TextInput>& inputs) {
  for (const auto& s : settings) {
    tok.set_truncation(s.trunc);
    tok.set_padding(s.pad);
    std::string args = spec + " " + s.args + (s.batch ? " --chunk 1000000" : "");
    if (s.pad) args += " --pad-id " + std::to_string(s.pad->pad_id);
    const auto expected = run_oracle(args, inputs);
    compare(name + " [" + s.args + "]", tok, inputs, expected, s.batch, s.add_special, s.odd_split && inputs[0].b);
  }
  tok.set_truncation(std::nullopt);
  tok.set_padding(std::nullopt);
}

// `specials`: tokens the post-processor adds to a pair. Budgets left for the two texts are
// even except in the last setting (see compare's odd_split).
std::vector<Setting> shaping_settings(int32_t pad_id, size_t specials) {
  auto trunc = [](size_t n, TruncationStrategy s, Side d = Side::right) { return TruncationParams{n, s, d}; };
  auto pad = [&](std::optional<size_t> n, Side d = Side::right) {
    PaddingParams p;
    p.length = n;
    p.direction = d;
    p.pad_id = pad_id;
    return p;
  };
  auto len = [&](size_t budget) { return std::to_string(budget + specials); };
  using TS = TruncationStrategy;
  return {
      {"--max-length " + len(22) + " --pad-to 40", trunc(22 + specials, TS::longest_first), pad(40)},
      {"--max-length " + len(14) + " --strategy longest_first", trunc(14 + specials, TS::longest_first), std::nullopt},
      {"--max-length " + len(27) + " --strategy only_first", trunc(27 + specials, TS::only_first), std::nullopt},
      {"--max-length " + len(27) + " --strategy only_second", trunc(27 + specials, TS::only_second), std::nullopt},
      {"--max-length " + len(18) + " --truncate-left --pad-to 32 --pad-left",
       trunc(18 + specials, TS::longest_first, Side::left), pad(32, Side::left)},
      {"--pad-longest", std::nullopt, pad(std::nullopt), true},
      {"--pad-longest --pad-left", std::nullopt, pad(std::nullopt, Side::left), true},
      {"--max-length 12 --no-special", trunc(12, TS::longest_first), std::nullopt, false, false},
      {"--max-length " + len(21) + " --strategy longest_first", trunc(21 + specials, TS::longest_first), std::nullopt,
       false, true, true},
  };
}

TEST(TokenizerConformance, BertTruncationPaddingPairs) {
  auto tok = load_tokenizer(kBertJson);
  const auto pairs = subset(true, 600), singles = subset(false, 400);
  run_settings("bert pairs", *tok, "--json " + kBertJson, shaping_settings(0, 3), pairs);
  auto settings = shaping_settings(0, 2);
  settings.erase(settings.begin() + 3);  // only_second needs pairs: singles are all errors
  run_settings("bert singles", *tok, "--json " + kBertJson, settings, singles);
}

TEST(TokenizerConformance, Gpt2TruncationPaddingPairs) {
  auto tok = load_tokenizer(kGpt2Json);
  const auto pairs = subset(true, 600);
  run_settings("gpt2 pairs", *tok, "--json " + kGpt2Json, shaping_settings(50256, 0), pairs);
  run_settings("gpt2 singles", *tok, "--json " + kGpt2Json, shaping_settings(50256, 0), subset(false, 400));
}

// Unicode and added-token edge cases through every tokenizer.
// GPT-2's tokenizer.json with other post-processors and add_prefix_space: RoBERTa's
// <s> A </s></s> B </s>, and a Sequence[ByteLevel, TemplateProcessing] with type ids.
std::pair<std::string, std::string> write_gpt2_variants(const std::string& dir) {
  std::ifstream in(kGpt2Json);
  json base = json::parse(in);
  json roberta = base;
  roberta["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"</s>", 2}}, {"cls", {"<s>", 0}},
                               {"trim_offsets", true}, {"add_prefix_space", false}};
  json templ = base;
  templ["pre_tokenizer"]["add_prefix_space"] = true;
  const json eot = {{"id", "<|endoftext|>"}, {"ids", {50256}}, {"tokens", {"<|endoftext|>"}}};
  templ["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair",
          {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 1}}}},
           {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
         {"special_tokens", {{"<|endoftext|>", eot}}}}}}};
  const std::string a = dir + "/roberta_post.json", b = dir + "/template_prefix_space.json";
  std::ofstream(a) << roberta.dump();
  std::ofstream(b) << templ.dump();
  return {a, b};
}

TEST(TokenizerConformance, EdgeCases) {
  const auto inputs = edge_cases();
  struct Case {
    std::string label, path, spec;
  };
  char tmpl[] = "/tmp/mt_tok_variants_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const auto [roberta, templ] = write_gpt2_variants(dir);
  for (const auto& c : {Case{"gpt2 RobertaProcessing", roberta, "--json " + roberta},
                        Case{"gpt2 add_prefix_space + Sequence[ByteLevel, Template]", templ, "--json " + templ},
                        Case{"bert uncased json", kBertJson, "--json " + kBertJson},
                        Case{"bert uncased vocab.txt", kBertUncasedVocab, "--wordpiece " + kBertUncasedVocab + " --lowercase 1"},
                        Case{"bert cased vocab.txt", kBertCasedVocab, "--wordpiece " + kBertCasedVocab + " --lowercase 0"},
                        Case{"gpt2 json", kGpt2Json, "--json " + kGpt2Json},
                        Case{"gpt2 encoder.json", kGpt2Encoder, "--bpe " + kGpt2Encoder + " " + kGpt2Bpe}}) {
    auto tok = load_tokenizer(c.path);
    compare("edge cases " + c.label, *tok, inputs, run_oracle(c.spec + " --decode", inputs));
    const size_t specials = tok->post_processor().added_tokens(true);
    tok->set_truncation(TruncationParams{10 + specials, TruncationStrategy::longest_first, Side::right});
    compare("edge cases " + c.label + " truncated", *tok, inputs,
            run_oracle(c.spec + " --max-length " + std::to_string(10 + specials), inputs));
  }
  fs::remove_all(dir);
}

// SentencePiece: ids equal libsentencepiece's own, decode equals its decode, and
// re-encoding the decoded text gives the same ids.
TEST(TokenizerConformance, SentencePieceT5) {
  auto tok = load_tokenizer(kT5Model);
  EXPECT_EQ(tok->model_type(), "SentencePiece");
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(kT5Model).ok());
  // The model's pieces plus T5Tokenizer's 100 sentinels.
  EXPECT_EQ(tok->vocab_size(), sp.GetPieceSize() + 100);
  std::vector<std::string> texts;
  for (const auto& x : all_inputs()) {
    texts.push_back(x.a);
    if (x.b) texts.push_back(*x.b);
  }
  for (const auto& x : edge_cases()) texts.push_back(x.a);
  const auto t0 = std::chrono::steady_clock::now();
  // Without special tokens: the library knows nothing of T5's appended </s>.
  const auto encs = tok->encode_batch(texts, false);
  const double secs = seconds_since(t0);
  size_t same_ids = 0, same_decode = 0, stable = 0, exact_round_trip = 0, shown = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto expected = sp.EncodeAsIds(texts[i]);
    const std::vector<int32_t> exp32(expected.begin(), expected.end());
    const bool ids_ok = encs[i].ids == exp32;
    same_ids += ids_ok;
    const std::string decoded = tok->decode(encs[i].ids);
    same_decode += decoded == sp.DecodeIds(expected);
    stable += tok->encode(decoded, false).ids == encs[i].ids;
    exact_round_trip += decoded == texts[i];
    if (!ids_ok && shown++ < 3)
      std::cout << "  MISMATCH sentencepiece " << json(texts[i]).dump() << "\n    lib : " << ids_str(exp32)
                << "\n    ours: " << ids_str(encs[i].ids) << "\n";
  }
  std::cout << "[conformance] t5 spiece.model vs libsentencepiece: ids identical " << same_ids << "/" << texts.size()
            << ", decode identical " << same_decode << "/" << texts.size() << ", re-encode of decode stable " << stable
            << "/" << texts.size() << ", decode == input " << exact_round_trip << "/" << texts.size()
            << " (T5 normalizes text) (ours " << secs << " s)\n";
  EXPECT_EQ(same_ids, texts.size());
  EXPECT_EQ(same_decode, texts.size());
  // Not every decode re-encodes to the same ids (unknown characters decode to " ⁇ "), but
  // nearly all do.
  EXPECT_GT(double(stable), 0.98 * double(texts.size()));
  // Control symbols are special: kept on request, dropped by default.
  const int32_t eos = sp.eos_id();
  const std::vector<int32_t> ids = {sp.PieceToId("▁Hello"), eos};
  EXPECT_EQ(tok->decode(ids, true), "Hello");
  EXPECT_EQ(tok->decode(ids, false), "Hello</s>");
}

}  // namespace
}  // namespace mt::tokenizers
