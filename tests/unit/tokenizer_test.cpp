// Tokenizer unit tests: loaders and their error messages, the pipeline pieces (WordPiece,
// GPT-2 split, BPE merges, added tokens), templates, truncation, padding, decode, batch.
// Conformance with Hugging Face on real data is tests/oracle/tokenizer_conformance_test.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "meshtrain/core/error.h"
#include "meshtrain/data/documents.h"
#include "meshtrain/data/text_file.h"
#include "meshtrain/tokenizers/bpe.h"
#include "meshtrain/tokenizers/sentencepiece.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/tokenizers/unicode.h"
#include "meshtrain/tokenizers/wordpiece.h"
#include "tests/support/op_check.h"

namespace mt::tokenizers {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

const std::string kData = MT_DATA_DIR;
const std::string kBertJson = kData + "/tokenizers/bert-base-uncased-tokenizer.json";
const std::string kGpt2Json = kData + "/models/hf-tiny-gpt2/tokenizer.json";

// A scratch directory removed at the end of each test.
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/mt_tok_unit_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(path / name, std::ios::binary) << content;
    return (path / name).string();
  }
};

std::vector<std::string> tokens_of(const Encoding& e) { return e.tokens; }

// A small WordPiece vocabulary for exact expectations.
std::shared_ptr<WordPieceTokenizer> tiny_wordpiece(size_t max_chars = 100) {
  Vocab v;
  int32_t id = 0;
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "the", "a", ",", ".",
                        "!", "hello", "world", "cafe", "##s", "中", "[NEW]"})
    v.add(t, id++);
  WordPieceOptions o;
  o.max_input_chars_per_word = max_chars;
  auto tok = std::make_shared<WordPieceTokenizer>(std::move(v), o);
  tok->add_special_tokens({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"});
  tok->set_post_processor(TemplateProcessing::bert("[CLS]", 2, "[SEP]", 3));
  return tok;
}

TEST(Tokenizer, WordPieceGreedyLongestMatch) {
  auto tok = tiny_wordpiece();
  auto e = tok->encode("UnAffable, the Cafés! 中xyz");
  EXPECT_EQ(tokens_of(e), (std::vector<std::string>{"[CLS]", "un", "##aff", "##able", ",", "the", "cafe", "##s", "!",
                                                     "中", "[UNK]", "[SEP]"}));
  EXPECT_EQ(e.ids, (std::vector<int32_t>{2, 5, 6, 7, 10, 8, 15, 16, 12, 17, 1, 3}));
  // Byte offsets into the original text (accents and case are normalized away).
  EXPECT_EQ(e.offsets[1], (Offsets{0, 2}));
  EXPECT_EQ(e.offsets[3], (Offsets{5, 9}));
  EXPECT_EQ(e.offsets[6], (Offsets{15, 20}));  // "Caf" + "é" (2 bytes) -> "cafe"
  EXPECT_EQ(e.offsets[7], (Offsets{20, 21}));
  EXPECT_EQ(e.offsets[9], (Offsets{23, 26}));  // 中 is 3 bytes
  EXPECT_EQ(e.offsets[0], (Offsets{0, 0}));
  EXPECT_EQ(tok->decode(e.ids), "unaffable, the cafes! 中");
  EXPECT_EQ(tok->decode(e.ids, false), "[CLS] unaffable, the cafes! 中 [UNK] [SEP]");
}

TEST(Tokenizer, WordPieceMaxInputCharsPerWord) {
  auto tok = tiny_wordpiece(5);
  EXPECT_EQ(tokens_of(tok->encode("hello helloo", false)), (std::vector<std::string>{"hello", "[UNK]"}));
}

TEST(Tokenizer, BertCleanTextAndSpecialTokensInText) {
  auto tok = load_tokenizer(kBertJson);
  // Controls vanish, any whitespace splits, [SEP] in the text is the special token.
  auto e = tok->encode("hello\x01\x7f world\u00a0again[SEP]x", false);
  EXPECT_EQ(tokens_of(e), (std::vector<std::string>{"hello", "world", "again", "[SEP]", "x"}));
  EXPECT_EQ(e.offsets[3], (Offsets{20, 25}));
}

TEST(Tokenizer, Gpt2SplitPattern) {
  auto split = [](std::string_view text) {
    std::vector<std::pair<uint32_t, uint32_t>> pieces;
    gpt2_split(text, pieces);
    std::vector<std::string> out;
    for (auto [b, e] : pieces) out.emplace_back(text.substr(b, e - b));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Hello world's end"), (V{"Hello", " world", "'s", " end"}));
  EXPECT_EQ(split("a  b   c"), (V{"a", " ", " b", "  ", " c"}));
  // "\s+(?!\S)" leaves the last newline to stand alone before the word.
  EXPECT_EQ(split("x\n\ny  "), (V{"x", "\n", "\n", "y", "  "}));
  EXPECT_EQ(split("x\n\n"), (V{"x", "\n\n"}));
  EXPECT_EQ(split("it'S ''s ?!? 123abc é"), (V{"it", "'", "S", " ''", "s", " ?!?", " 123", "abc", " é"}));
  EXPECT_EQ(split("we'll they're I'd"), (V{"we", "'ll", " they", "'re", " I", "'d"}));
  EXPECT_EQ(split(" \tx"), (V{" ", "\t", "x"}));
  EXPECT_EQ(split(""), V{});
}

TEST(Tokenizer, ByteLevelBpeMergesAndDecode) {
  auto tok = load_tokenizer(kGpt2Json);
  auto e = tok->encode("Hello, world!");
  EXPECT_EQ(e.ids, (std::vector<int32_t>{15496, 11, 995, 0}));
  EXPECT_EQ(tokens_of(e), (std::vector<std::string>{"Hello", ",", "Ġworld", "!"}));
  EXPECT_EQ(e.offsets[2], (Offsets{6, 12}));
  // Repeated words come from the cache and give the same ids.
  EXPECT_EQ(tok->encode("Hello, world!").ids, e.ids);
  EXPECT_EQ(tok->decode(e.ids), "Hello, world!");
  // <|endoftext|> is split out before pre-tokenization and skipped by decode.
  auto s = tok->encode("a<|endoftext|>b");
  EXPECT_EQ(s.ids, (std::vector<int32_t>{64, 50256, 65}));
  EXPECT_EQ(tok->decode(s.ids), "ab");
  EXPECT_EQ(tok->decode(s.ids, false), "a<|endoftext|>b");
  // A token that is half of a UTF-8 character decodes to U+FFFD.
  const auto euro = tok->encode("🤗").ids;
  ASSERT_GT(euro.size(), 1u);
  EXPECT_EQ(tok->decode(std::vector<int32_t>{euro[0]}), "\xEF\xBF\xBD");
}

TEST(Tokenizer, Utf8Lossy) {
  EXPECT_EQ(unicode::utf8_lossy("ok\xE2\x82"), "ok\xEF\xBF\xBD");                   // truncated: one U+FFFD
  EXPECT_EQ(unicode::utf8_lossy("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");           // overlong: two
  EXPECT_EQ(unicode::utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(unicode::utf8_lossy("\xF0\x9F\xA4\x97"), "\xF0\x9F\xA4\x97");
}

TEST(Tokenizer, AddedTokensStripAndSingleWord) {
  auto tok = tiny_wordpiece();
  AddedToken mask{"<m>", -1, true, false, true, true, false};
  AddedToken word{"zz", -1, false, false, false, false, true};
  tok->add_tokens({mask, word});
  const int32_t mask_id = *tok->token_to_id("<m>"), zz = *tok->token_to_id("zz");
  EXPECT_EQ(mask_id, 19);  // the next free id
  EXPECT_EQ(zz, 20);
  EXPECT_EQ(tok->vocab_size(), 21);
  EXPECT_EQ(*tok->id_to_token(19), "<m>");
  EXPECT_FALSE(tok->id_to_token(99).has_value());
  // lstrip/rstrip swallow the spaces around <m>; "zz" matches only as a whole word.
  auto e = tok->encode("hello  <m>  world zz azz", false);
  EXPECT_EQ(tokens_of(e), (std::vector<std::string>{"hello", "<m>", "world", "zz", "[UNK]"}));
  EXPECT_EQ(e.offsets[1], (Offsets{5, 12}));
  // Adding a token that is already in the vocabulary keeps its id.
  tok->add_tokens({AddedToken{"hello", -1}});
  EXPECT_EQ(*tok->token_to_id("hello"), 13);
}

TEST(Tokenizer, TemplateParseMatchesBert) {
  auto tpl = TemplateProcessing::parse("[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1",
                                       {{"[CLS]", {{2}, {"[CLS]"}}}, {"[SEP]", {{3}, {"[SEP]"}}}});
  auto tok = tiny_wordpiece();
  const auto ref = tok->encode_pair("hello", "the world");
  tok->set_post_processor(tpl);
  const auto got = tok->encode_pair("hello", "the world");
  EXPECT_EQ(got.ids, ref.ids);
  EXPECT_EQ(got.type_ids, ref.type_ids);
  EXPECT_EQ(ref.type_ids, (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(ref.sequence_ids, (std::vector<int32_t>{-1, 0, -1, 1, 1, -1}));
  EXPECT_EQ(tpl.added_tokens(false), 2u);
  EXPECT_EQ(tpl.added_tokens(true), 3u);
  expect_error([] { TemplateProcessing::parse("[X] $A", "$A $B", {}); }, {"[X]", "not defined"});
  expect_error([] { TemplateProcessing::parse("$C", "$A $B", {}); }, {"bad template sequence '$C'"});
}

Encoding of_length(size_t n) {
  Encoding e;
  for (size_t i = 0; i < n; ++i) e.push_back(int32_t(i), "t", {0, 0}, 0, 0, false);
  return e;
}

TEST(Tokenizer, TruncationStrategies) {
  // Hugging Face's own table for max_length 7 (first, second) -> (kept first, kept second).
  const std::vector<std::array<size_t, 4>> table = {
      {0, 0, 0, 0}, {0, 2, 0, 2}, {0, 4, 0, 4}, {0, 8, 0, 7}, {2, 0, 2, 0}, {2, 2, 2, 2}, {2, 4, 2, 4}, {2, 8, 2, 5},
      {4, 0, 4, 0}, {4, 2, 4, 2}, {4, 4, 3, 4}, {4, 8, 3, 4}, {8, 0, 7, 0}, {8, 2, 5, 2}, {8, 4, 4, 3}, {8, 8, 3, 4}};
  for (const auto& [n1, n2, k1, k2] : table) {
    Encoding a = of_length(n1), b = of_length(n2);
    truncate_pair(a, &b, 7, TruncationStrategy::longest_first, Side::right);
    EXPECT_EQ(a.size(), k1) << n1 << "," << n2;
    EXPECT_EQ(b.size(), k2) << n1 << "," << n2;
  }
  Encoding a = of_length(10), b = of_length(6);
  truncate_pair(a, &b, 12, TruncationStrategy::only_first, Side::left);
  EXPECT_EQ(a.ids, (std::vector<int32_t>{4, 5, 6, 7, 8, 9}));  // the head goes
  EXPECT_EQ(b.size(), 6u);
  Encoding c = of_length(3), d = of_length(6);
  expect_error([&] { truncate_pair(c, &d, 4, TruncationStrategy::only_first, Side::right); },
               {"only_first", "has 3 tokens", "remove the 5"});
  expect_error([&] { truncate_pair(c, nullptr, 2, TruncationStrategy::only_second, Side::right); },
               {"only_second needs a second sequence"});
  auto tok = tiny_wordpiece();
  tok->set_truncation(TruncationParams{2});
  expect_error([&] { tok->encode_pair("a", "b"); }, {"max_length 2", "3 special tokens"});
  EXPECT_EQ(parse_truncation_strategy("OnlySecond"), TruncationStrategy::only_second);
  expect_error([] { parse_truncation_strategy("middle_out"); }, {"unknown truncation strategy 'middle_out'"});
}

TEST(Tokenizer, PaddingAndBatch) {
  auto tok = load_tokenizer(kBertJson);
  const std::vector<std::string> texts = {"a", "hello there", "a somewhat longer sentence, with punctuation!", ""};
  std::vector<Encoding> single;
  for (const auto& t : texts) single.push_back(tok->encode(t));
  const auto batch = tok->encode_batch(texts);  // parallel; no padding set: same as one by one
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(batch[i].ids, single[i].ids);

  PaddingParams p;  // longest in the batch, padded to a multiple of 4
  p.pad_to_multiple_of = 4;
  tok->set_padding(p);
  const auto padded = tok->encode_batch(texts);
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(padded[i].size(), 12u);
    const size_t n = single[i].size();
    EXPECT_EQ(std::vector<int32_t>(padded[i].ids.begin(), padded[i].ids.begin() + long(n)), single[i].ids);
    for (size_t k = 0; k < 12; ++k) EXPECT_EQ(padded[i].attention_mask[k], k < n ? 1 : 0);
  }
  p.length = 6;
  p.direction = Side::left;
  p.pad_to_multiple_of = 0;
  p.pad_id = 7;
  tok->set_padding(p);
  const auto left = tok->encode("a");
  EXPECT_EQ(left.ids, (std::vector<int32_t>{7, 7, 7, 101, 1037, 102}));
  EXPECT_EQ(left.attention_mask, (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(tok->encode(texts[2]).size(), 12u);  // padding never truncates
  const std::vector<std::pair<std::string, std::string>> pairs = {{"a", "b"}, {"hello", "there you"}};
  const auto pb = tok->encode_batch(pairs);
  EXPECT_EQ(pb[1].type_ids, (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(pb[0].ids, (std::vector<int32_t>{7, 101, 1037, 102, 1038, 102}));
}

// prepare-data encodes a long document in pieces cut at lines (data::cut_at_lines) where the
// tokenizer says such cuts are exact: for GPT-2's BPE and BERT's WordPiece the pieces of Tiny
// Shakespeare (cut every 4 KiB: about 270 cuts) give the whole text's ids. SentencePiece does
// not claim it (its dummy prefix at a piece's start would add tokens).
TEST(Tokenizer, NewlineCutsEncodeToTheWholeTextsIds) {
  const std::string text = data::read_text_file(kData + "/text/tinyshakespeare.txt");
  const std::vector<std::string_view> pieces = data::cut_at_lines(text, 4096);
  ASSERT_GT(pieces.size(), 200u);
  std::string joined;
  for (size_t i = 0; i < pieces.size(); ++i) {
    joined += pieces[i];
    if (i + 1 < pieces.size()) EXPECT_GE(pieces[i].size(), 4096u) << "piece " << i;
  }
  ASSERT_EQ(joined, text);
  for (const std::string& path : {kGpt2Json, kBertJson}) {
    auto tok = load_tokenizer(path);
    ASSERT_TRUE(tok->newline_cuts_are_exact()) << path;
    const std::vector<int32_t> whole = tok->encode(text, false).ids;
    std::vector<int32_t> cut;
    for (std::string_view p : pieces) {
      const std::vector<int32_t> ids = tok->encode(p, false).ids;
      cut.insert(cut.end(), ids.begin(), ids.end());
    }
    std::cout << "  " << path << ": " << whole.size() << " ids whole, " << cut.size() << " in " << pieces.size()
              << " pieces\n";
    EXPECT_TRUE(cut == whole) << path;
  }
  EXPECT_FALSE(load_tokenizer(kData + "/tokenizers/t5-spiece.model")->newline_cuts_are_exact());
  // No qualifying newline: one piece.
  EXPECT_EQ(data::cut_at_lines("a\n\nb \n c", 1).size(), 1u);
  EXPECT_EQ(data::cut_at_lines("ab\ncd\nef", 1), (std::vector<std::string_view>{"ab\n", "cd\n", "ef"}));
  // A no-break space (U+00A0) before the newline is whitespace to the pre-tokenizers: no cut.
  EXPECT_EQ(data::cut_at_lines("ab\xc2\xa0\ncd", 1).size(), 1u);
  // An added token that swallows whitespace on its left could swallow the newline of a cut.
  auto gpt2 = load_tokenizer(kGpt2Json);
  AddedToken swallowing;
  swallowing.content = "Foo", swallowing.lstrip = true;
  gpt2->add_tokens({swallowing});
  EXPECT_FALSE(gpt2->newline_cuts_are_exact());
}

TEST(Tokenizer, LoadsEveryLayout) {
  EXPECT_EQ(load_tokenizer(kData + "/models/hf-tiny-bert")->model_type(), "WordPiece");
  EXPECT_EQ(load_tokenizer(kData + "/models/hf-tiny-gpt2")->model_type(), "BPE");
  EXPECT_EQ(load_tokenizer(kData + "/tokenizers/t5-spiece.model")->model_type(), "SentencePiece");
  // vocab.txt: casing from tokenizer_config.json, or from the vocabulary itself.
  TempDir dir;
  std::ifstream src(kData + "/tokenizers/bert-base-uncased-vocab.txt");
  dir.write("vocab.txt", std::string(std::istreambuf_iterator<char>(src), {}));
  EXPECT_EQ(load_tokenizer(dir.path.string())->encode("Hello", false).tokens[0], "hello");
  dir.write("tokenizer_config.json", R"({"do_lower_case": false})");
  EXPECT_EQ(load_tokenizer(dir.path.string())->encode("Hello", false).tokens[0], "[UNK]");
  EXPECT_EQ(load_tokenizer(dir.path.string(), {.lowercase = true})->encode("Hello", false).tokens[0], "hello");
  EXPECT_EQ(load_tokenizer(kData + "/tokenizers/bert-base-cased-vocab.txt")->encode("Hello", false).tokens[0], "Hello");
}

// T5's .model gets what T5Tokenizer adds: "</s>" at the end and the <extra_id_N> sentinels
// counting down from 32099. Expected ids are the ones printed in Hugging Face's T5
// documentation (training and translation examples).
TEST(Tokenizer, T5SentencePieceAppendsEndAndKnowsSentinels) {
  auto tok = load_tokenizer(kData + "/tokenizers/t5-spiece.model");
  EXPECT_EQ(tok->vocab_size(), 32100);
  auto ids = [&](const std::string& text) { return tok->encode(text).ids; };
  EXPECT_EQ(ids("The <extra_id_0> walks in <extra_id_1> park"), (std::vector<int32_t>{37, 32099, 10681, 16, 32098, 2447, 1}));
  EXPECT_EQ(ids("<extra_id_0> cute dog <extra_id_1> the <extra_id_2>"),
            (std::vector<int32_t>{32099, 5295, 1782, 32098, 8, 32097, 1}));
  EXPECT_EQ(ids("translate English to German: The house is wonderful."),
            (std::vector<int32_t>{13959, 1566, 12, 2968, 10, 37, 629, 19, 1627, 5, 1}));
  EXPECT_EQ(ids("Das Haus ist wunderbar."), (std::vector<int32_t>{644, 4598, 229, 19250, 5, 1}));
  EXPECT_EQ(tok->encode("Das Haus", false).ids, (std::vector<int32_t>{644, 4598}));
  EXPECT_EQ(tok->encode_pair("a", "b").ids.back(), 1);
  EXPECT_EQ(tok->token_to_id("<extra_id_99>"), 32000);
  EXPECT_EQ(tok->id_to_token(32099), "<extra_id_0>");
  EXPECT_TRUE(tok->is_special(32050));
  EXPECT_EQ(tok->decode(ids("The <extra_id_0> walks")), "The walks");
  // tokenizer_config.json beside the model sets the number of sentinels.
  TempDir dir;
  fs::copy_file(kData + "/tokenizers/t5-spiece.model", dir.path / "spiece.model");
  dir.write("tokenizer_config.json", R"({"extra_ids": 3})");
  auto three = load_tokenizer(dir.path.string());
  EXPECT_EQ(three->vocab_size(), 32003);
  EXPECT_EQ(three->token_to_id("<extra_id_0>"), 32002);
  EXPECT_FALSE(three->token_to_id("<extra_id_3>"));
  dir.write("tokenizer_config.json", R"({"extra_ids": "many"})");
  EXPECT_THROW(load_tokenizer(dir.path.string()), Error);
}

TEST(Tokenizer, MalformedFilesNameTheFileAndProblem) {
  TempDir dir;
  const auto bad_json = dir.write("bad.json", "{ \"model\": ");
  expect_error([&] { load_tokenizer(bad_json); }, {bad_json, "bad JSON"});
  const auto no_model = dir.write("no_model.json", R"({"version": "1.0"})");
  expect_error([&] { load_tokenizer(no_model); }, {no_model, "missing key 'model'"});
  const auto no_vocab = dir.write("wordpiece_without_vocab.json",
                                  R"({"model": {"type": "WordPiece"}, "pre_tokenizer": {"type": "BertPreTokenizer"}})");
  expect_error([&] { load_tokenizer(no_vocab); }, {no_vocab, "missing key 'model.vocab'"});
  const auto unknown = dir.write("unknown.json", R"({"model": {"type": "Magic", "vocab": {}}})");
  expect_error([&] { load_tokenizer(unknown); }, {unknown, "unknown model type 'Magic'"});
  const auto unigram = dir.write("unigram.json", R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})");
  expect_error([&] { load_tokenizer(unigram); }, {unigram, "'Unigram' is not supported"});
  const auto bad_type = dir.write(
      "bad_type.json", R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0}, "max_input_chars_per_word": "x"},
                           "pre_tokenizer": {"type": "BertPreTokenizer"}})");
  expect_error([&] { load_tokenizer(bad_type); }, {bad_type, "model.max_input_chars_per_word", "wrong type"});
  const auto bad_added = dir.write(
      "bad_added.json", R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0}}, "normalizer": null,
                            "pre_tokenizer": {"type": "BertPreTokenizer"}, "added_tokens": [{"id": 0}]})");
  expect_error([&] { load_tokenizer(bad_added); }, {bad_added, "missing key 'added_tokens[0].content'"});
  const auto no_unk = dir.write(
      "no_unk.json", R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "BertPreTokenizer"}})");
  expect_error([&] { load_tokenizer(no_unk); }, {no_unk, "unk token '[UNK]'"});
  const auto bad_pre = dir.write(
      "bad_pre.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Whitespace"}})");
  expect_error([&] { load_tokenizer(bad_pre); }, {bad_pre, "unsupported pre_tokenizer"});
  const auto bad_merge = dir.write(
      "bad_merge.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}, "pre_tokenizer": {"type": "ByteLevel"}})");
  expect_error([&] { load_tokenizer(bad_merge); }, {bad_merge, "model.merges[0] = 'a'"});

  // LLaMA-family pipelines: what is outside it is named with its key path.
  auto llama = [&](const std::string& name, const std::string& normalizer, const std::string& pre,
                   const std::string& decoder, const std::string& model_extra) {
    return dir.write(name, R"({"model": {"type": "BPE", "vocab": {"<unk>": 0, "\u2581": 1, "a": 2}, "merges": [])" +
                               model_extra + "}, \"normalizer\": " + normalizer + ", \"pre_tokenizer\": " + pre +
                               ", \"decoder\": " + decoder + "}");
  };
  const auto nfkc = llama("nfkc.json", R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "x"}, {"type": "NFKC"}]})", "null", "null", "");
  expect_error([&] { load_tokenizer(nfkc); }, {nfkc, "unsupported normalizer type 'NFKC'", "normalizer.normalizers[1]."});
  const auto regex = llama("regex.json", R"({"type": "Replace", "pattern": {"Regex": " +"}, "content": "x"})", "null", "null", "");
  expect_error([&] { load_tokenizer(regex); }, {regex, "'normalizer.pattern' is a Regex"});
  const auto scheme = llama("scheme.json", "null", R"({"type": "Metaspace", "replacement": "x", "prepend_scheme": "sometimes"})", "null", "");
  expect_error([&] { load_tokenizer(scheme); }, {scheme, "pre_tokenizer.prepend_scheme", "'sometimes'"});
  const auto two_chars = llama("two_chars.json", "null", R"({"type": "Metaspace", "replacement": "xy"})", "null", "");
  expect_error([&] { load_tokenizer(two_chars); }, {two_chars, "replacement 'xy' must be one character"});
  const auto bad_decoder = llama("bad_decoder.json", "null", "null", R"({"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "CTC"}]})", "");
  expect_error([&] { load_tokenizer(bad_decoder); }, {bad_decoder, "unsupported decoder type 'CTC'", "decoder.decoders[1]."});
  const auto no_unk_bpe = llama("no_unk_bpe.json", "null", "null", "null", R"(, "unk_token": "<missing>")");
  expect_error([&] { load_tokenizer(no_unk_bpe); }, {no_unk_bpe, "unk_token '<missing>' is not in model.vocab"});

  // vocab.json + merges.txt: a bad line is reported with its number.
  TempDir bpe;
  bpe.write("vocab.json", R"({"a": 0, "b": 1, "ab": 2, "c": 3})");
  const auto merges = bpe.write("merges.txt", "#version: 0.2\na b\nab c d\n");
  expect_error([&] { load_tokenizer(bpe.path.string()); }, {merges, "line 3", "two space-separated tokens"});
  bpe.write("merges.txt", "#version: 0.2\na b\nab c\n");
  expect_error([&] { load_tokenizer(bpe.path.string()); }, {merges, "line 3", "'abc' is missing from the vocabulary"});
  bpe.write("vocab.json", R"({"a": "zero"})");
  expect_error([&] { load_tokenizer(bpe.path.string()); }, {"vocab.json", "token 'a' has id \"zero\""});

  TempDir lonely;
  const auto enc = lonely.write("encoder.json", R"({"a": 0})");
  expect_error([&] { load_tokenizer(enc); }, {enc, "no merges file"});
  expect_error([&] { load_tokenizer(lonely.write("x.bin", "")); }, {"unknown tokenizer file type"});
  expect_error([&] { load_tokenizer(lonely.write("bad.model", "not a protobuf")); },
               {"bad.model", "not a valid SentencePiece model"});
  TempDir empty;
  expect_error([&] { load_tokenizer(empty.path.string()); }, {empty.path.string(), "holds no tokenizer"});
  expect_error([] { load_tokenizer("/nonexistent/tokenizer.json"); }, {"/nonexistent/tokenizer.json", "does not exist"});
  const auto no_unk_txt = empty.write("vocab.txt", "[CLS]\n[SEP]\nhello\n");
  expect_error([&] { load_tokenizer(no_unk_txt); }, {no_unk_txt, "'[UNK]' is not in the vocabulary"});
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  auto tok = load_tokenizer(kBertJson);
  expect_error([&] { tok->decode(std::vector<int32_t>{101, 40000}); }, {"id 40000", "not in the vocabulary"});
  EXPECT_EQ(tok->decode(std::vector<int32_t>{}), "");
}

}  // namespace
}  // namespace mt::tokenizers
