#include "tests/support/llama_tokenizer_fixture.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "meshtrain/tokenizers/unicode.h"

namespace mt::test {
namespace {

using json = nlohmann::json;
const std::string kSpace = "\xE2\x96\x81";  // ▁

std::vector<std::string> chars_of(const std::string& w) {
  std::vector<std::string> out;
  uint32_t cp;
  for (size_t i = 0; i < w.size();) {
    const size_t n = tokenizers::unicode::decode_utf8(w, i, cp);
    out.push_back(w.substr(i, n));
    i += n;
  }
  return out;
}

json added(int id, const std::string& content, bool special, bool normalized) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", normalized}, {"special", special}};
}

json replace_step(const std::string& from, const std::string& to) {
  return {{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
}

}  // namespace

std::string shakespeare_prefix(size_t bytes) {
  std::ifstream in(std::string(MT_DATA_DIR) + "/text/tinyshakespeare.txt", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str().substr(0, bytes);
}

json llama_tokenizer_json(const std::string& corpus, const LlamaTokenizerStyle& s, size_t num_merges) {
  // Words as SentencePiece sees them: "▁" + each space-separated word of each line.
  std::map<std::string, int64_t> word_count;
  std::map<std::string, int64_t> char_count;
  size_t line_start = 0;
  while (line_start < corpus.size()) {
    size_t line_end = corpus.find('\n', line_start);
    if (line_end == std::string::npos) line_end = corpus.size();
    size_t i = line_start;
    while (i < line_end) {
      size_t j = corpus.find(' ', i);
      if (j == std::string::npos || j > line_end) j = line_end;
      if (j > i) ++word_count[kSpace + corpus.substr(i, j - i)];
      i = j + 1;
    }
    line_start = line_end + 1;
  }
  for (const auto& [w, n] : word_count)
    for (const auto& c : chars_of(w)) char_count[c] += n;
  // The base vocabulary: characters seen at least twice, and a few beyond the corpus.
  std::vector<std::string> vocab_list = {"<unk>", "<s>", "</s>"};
  if (s.byte_tokens)
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      vocab_list.push_back(hex);
    }
  std::set<std::string> chars;
  for (const auto& [c, n] : char_count)
    if (n >= 2) chars.insert(c);
  for (const char* extra : {"\xC3\xA9", "\xC3\xBC", "\xE4\xB8\xAD", "\xE6\x96\x87"}) chars.insert(extra);  // é ü 中 文
  std::unordered_map<std::string, int> id_of;
  for (const auto& t : vocab_list) id_of.emplace(t, int(id_of.size()));
  for (const auto& c : chars) {
    id_of.emplace(c, int(vocab_list.size()));
    vocab_list.push_back(c);
  }
  // Words as symbol ids (a character outside the vocabulary splits the word).
  std::vector<std::pair<std::vector<int>, int64_t>> words;
  for (const auto& [w, n] : word_count) {
    std::vector<int> sym;
    for (const auto& c : chars_of(w)) {
      auto it = id_of.find(c);
      if (it == id_of.end()) {
        if (sym.size() > 1) words.emplace_back(sym, n);
        sym.clear();
      } else {
        sym.push_back(it->second);
      }
    }
    if (sym.size() > 1) words.emplace_back(sym, n);
  }
  json merges = json::array();
  for (size_t m = 0; m < num_merges; ++m) {
    std::unordered_map<uint64_t, int64_t> pairs;
    for (const auto& [sym, n] : words)
      for (size_t k = 0; k + 1 < sym.size(); ++k) pairs[uint64_t(sym[k]) << 32 | uint32_t(sym[k + 1])] += n;
    if (pairs.empty()) break;
    // The most frequent pair; ties go to the smaller pair of strings (deterministic).
    uint64_t best = 0;
    int64_t best_n = -1;
    for (const auto& [p, n] : pairs) {
      const auto key = std::make_pair(vocab_list[p >> 32], vocab_list[p & 0xFFFFFFFF]);
      if (n > best_n || (n == best_n && key < std::make_pair(vocab_list[best >> 32], vocab_list[best & 0xFFFFFFFF]))) {
        best = p;
        best_n = n;
      }
    }
    const int a = int(best >> 32), b = int(best & 0xFFFFFFFF);
    const std::string merged = vocab_list[size_t(a)] + vocab_list[size_t(b)];
    auto [it, fresh] = id_of.emplace(merged, int(vocab_list.size()));
    if (fresh) vocab_list.push_back(merged);
    merges.push_back(json::array({vocab_list[size_t(a)], vocab_list[size_t(b)]}));
    for (auto& [sym, n] : words) {
      std::vector<int> next;
      for (size_t k = 0; k < sym.size(); ++k) {
        if (k + 1 < sym.size() && sym[k] == a && sym[k + 1] == b) {
          next.push_back(it->second);
          ++k;
        } else {
          next.push_back(sym[k]);
        }
      }
      sym = std::move(next);
    }
  }

  json vocab = json::object();
  for (size_t i = 0; i < vocab_list.size(); ++i) vocab[vocab_list[i]] = i;
  json added_tokens = {added(0, "<unk>", true, false), added(1, "<s>", true, false), added(2, "</s>", true, false)};
  if (s.chat_tokens) {
    added_tokens.push_back(added(int(vocab_list.size()), "<|user|>", false, false));
    added_tokens.push_back(added(int(vocab_list.size()) + 1, "<|bot|>", false, true));
  }
  json t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = added_tokens;
  if (s.legacy_normalizer) {
    t["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", {{{"type", "Prepend"}, {"prepend", kSpace}}, replace_step(" ", kSpace)}}};
    t["pre_tokenizer"] = nullptr;
  } else {
    t["normalizer"] = nullptr;
    t["pre_tokenizer"] = {
        {"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", s.prepend_scheme}, {"split", s.split}};
  }
  auto special = [](const char* id, int type_id) { return json{{"SpecialToken", {{"id", id}, {"type_id", type_id}}}}; };
  auto sequence = [](const char* id, int type_id) { return json{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
  t["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {special("<s>", 0), sequence("A", 0)}},
                         {"pair", {special("<s>", 0), sequence("A", 0), special("<s>", 1), sequence("B", 1)}},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  if (s.metaspace_decoder)
    t["decoder"] = {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", s.prepend_scheme}, {"split", s.split}};
  else
    t["decoder"] = {{"type", "Sequence"},
                    {"decoders",
                     {replace_step(kSpace, " "), {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  t["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", "<unk>"},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", s.fuse_unk},
                {"byte_fallback", s.byte_tokens},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}};
  return t;
}

}  // namespace mt::test
