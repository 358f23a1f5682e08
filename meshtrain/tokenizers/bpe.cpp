#include "meshtrain/tokenizers/bpe.h"

#include <fstream>
#include <mutex>
#include <algorithm>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/tokenizers/unicode.h"

namespace mt::tokenizers {
namespace {

// Character classes of the GPT-2 pattern.
enum Cls : uint8_t { kLetter, kNumber, kSpace, kOther };

struct AsciiCls {
  Cls cls[128];
  AsciiCls() {
    for (int c = 0; c < 128; ++c) {
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) cls[c] = kLetter;
      else if (c >= '0' && c <= '9') cls[c] = kNumber;
      else if (c == ' ' || (c >= 0x09 && c <= 0x0D)) cls[c] = kSpace;
      else cls[c] = kOther;
    }
  }
};
const AsciiCls kAscii;

inline Cls classify(std::string_view text, size_t i, size_t& len) {
  const unsigned char c = text[i];
  if (c < 0x80) {
    len = 1;
    return kAscii.cls[c];
  }
  uint32_t cp;
  len = unicode::decode_utf8(text, i, cp);
  if (unicode::is_letter(cp)) return kLetter;
  if (unicode::is_number(cp)) return kNumber;
  if (unicode::is_whitespace(cp)) return kSpace;
  return kOther;
}

}  // namespace

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the rest are
// shifted to U+0100 and up in byte order.
std::array<uint32_t, 256> byte_to_codepoint() {
  std::array<uint32_t, 256> map{};
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? b : 256 + n++;
  }
  return map;
}

void gpt2_split(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& pieces) {
  pieces.clear();
  const size_t n = text.size();
  size_t i = 0;
  auto run = [&](size_t from, Cls cls) {  // end of the run of `cls` characters starting at from
    size_t len;
    while (from < n && classify(text, from, len) == cls) from += len;
    return from;
  };
  while (i < n) {
    const char c = text[i];
    if (c == '\'' && i + 1 < n) {
      const char a = text[i + 1];
      const char b = i + 2 < n ? text[i + 2] : '\0';
      size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') len = 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) len = 3;
      if (len) {
        pieces.emplace_back(uint32_t(i), uint32_t(i + len));
        i += len;
        continue;
      }
    }
    size_t len;
    if (c == ' ' && i + 1 < n) {
      size_t len2;
      const Cls next = classify(text, i + 1, len2);
      if (next != kSpace) {  // " ?\p{L}+", " ?\p{N}+" or " ?[^\s\p{L}\p{N}]+"
        const size_t end = run(i + 1, next);
        pieces.emplace_back(uint32_t(i), uint32_t(end));
        i = end;
        continue;
      }
    }
    const Cls cls = classify(text, i, len);
    if (cls != kSpace) {
      const size_t end = run(i, cls);
      pieces.emplace_back(uint32_t(i), uint32_t(end));
      i = end;
      continue;
    }
    // Whitespace: "\s+(?!\S)" leaves the run's last character to prefix the next word;
    // a lone whitespace character before a word falls to "\s+".
    size_t end = i, last = i;
    while (end < n && classify(text, end, len) == kSpace) {
      last = end;
      end += len;
    }
    if (end < n && last > i) end = last;
    pieces.emplace_back(uint32_t(i), uint32_t(end));
    i = end;
  }
}

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(Vocab vocab, const std::vector<BpeMerge>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  MT_CHECK(vocab_.size() > 0, "[tokenizer] ", options_.source, ": BPE vocabulary is empty");
  const auto cps = byte_to_codepoint();
  for (int b = 0; b < 256; ++b) {
    unicode::append_utf8(byte_char_[b], cps[b]);
    char_byte_[cps[b]] = uint8_t(b);
    byte_id_[b] = vocab_.find(byte_char_[b]).value_or(-1);
  }
  merges_ = BpeMergeTable(vocab_, merges, options_.source);
}

void ByteLevelBpeTokenizer::bpe(std::string_view piece, Word& out) const {
  for (size_t i = 0; i < piece.size(); ++i) {
    const int32_t id = byte_id_[uint8_t(piece[i])];
    if (id >= 0) out.emplace_back(id, 1u);  // a byte the vocabulary lacks produces no token (no unk in byte-level BPE)
  }
  merges_.apply(out);
}

void ByteLevelBpeTokenizer::encode_piece(std::string_view piece, Word& out) const {
  out.clear();
  // Long pieces are rare and would crowd the cache.
  const bool cacheable = options_.cache_capacity > 0 && piece.size() < 256;
  CacheShard* shard = nullptr;
  if (cacheable) {
    shard = &cache_[StringHash{}(piece) % cache_.size()];
    std::shared_lock lock(shard->mutex);
    auto it = shard->words.find(piece);
    if (it != shard->words.end()) {
      out = it->second;
      return;
    }
  }
  bpe(piece, out);
  if (cacheable) {
    std::unique_lock lock(shard->mutex);
    if (shard->words.size() < options_.cache_capacity / cache_.size() + 1) shard->words.emplace(std::string(piece), out);
  }
}

void ByteLevelBpeTokenizer::tokenize_segment(std::string_view text, int64_t base, int32_t type_id,
                                             int32_t sequence_id, Encoding& out) const {
  std::string prefixed;
  int64_t shift = 0;
  if (options_.add_prefix_space && !text.empty() && text[0] != ' ') {
    prefixed.assign(1, ' ');
    prefixed.append(text);
    text = prefixed;
    shift = 1;  // the added space maps onto the first character
  }
  thread_local std::vector<std::pair<uint32_t, uint32_t>> pieces;
  if (options_.use_regex) gpt2_split(text, pieces);
  else pieces.assign(1, {0u, uint32_t(text.size())});
  thread_local Word word;
  for (const auto& [b, e] : pieces) {
    encode_piece(text.substr(b, e - b), word);
    int64_t at = b;
    for (const auto& [id, len] : word) {
      const int64_t s = std::max<int64_t>(at - shift, 0), t = std::max<int64_t>(at + len - shift, 0);
      out.push_back(id, *vocab_.token(id), {base + s, base + t}, type_id, sequence_id, false);
      at += len;
    }
  }
}

std::string ByteLevelBpeTokenizer::decode_tokens(const std::vector<int32_t>&,
                                                 const std::vector<std::string_view>& tokens) const {
  if (!options_.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  std::string bytes;
  for (std::string_view t : tokens) {
    uint32_t cp;
    for (size_t i = 0; i < t.size();) {
      const size_t len = unicode::decode_utf8(t, i, cp);
      auto it = char_byte_.find(cp);
      if (it != char_byte_.end()) bytes.push_back(char(it->second));
      else bytes.append(t.substr(i, len));  // not a byte stand-in (e.g. an added token): kept as is
      i += len;
    }
  }
  return unicode::utf8_lossy(bytes);
}

Vocab read_bpe_vocab_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "[tokenizer] cannot open BPE vocabulary '", path, "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::concat("[tokenizer] ", path, ": bad JSON: ", e.what()));
  }
  MT_CHECK(j.is_object(), "[tokenizer] ", path, ": expected a JSON object mapping tokens to ids");
  Vocab vocab;
  for (auto it = j.begin(); it != j.end(); ++it) {
    MT_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 && it.value().get<int64_t>() < (1ll << 31),
             "[tokenizer] ", path, ": token '", it.key(), "' has id ", it.value().dump(), " (expected an integer >= 0)");
    vocab.add(it.key(), it.value().get<int32_t>());
  }
  MT_CHECK(vocab.size() > 0, "[tokenizer] ", path, ": the vocabulary is empty");
  return vocab;
}

std::vector<BpeMerge> read_bpe_merges(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "[tokenizer] cannot open BPE merges '", path, "'");
  std::vector<BpeMerge> merges;
  std::string line;
  size_t line_no = 0;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  for (size_t k = 0; k < lines.size(); ++k) {
    line = lines[k];
    line_no = k + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("#version", 0) == 0) continue;
    if (line.empty() && k + 1 == lines.size()) continue;  // a trailing blank line
    const size_t sp = line.find(' ');
    MT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
             "[tokenizer] ", path, " line ", line_no, ": expected two space-separated tokens, got '", line, "'");
    merges.push_back({line.substr(0, sp), line.substr(sp + 1), line_no});
  }
  return merges;
}

std::shared_ptr<ByteLevelBpeTokenizer> load_bpe_files(const std::string& vocab_path, const std::string& merges_path) {
  Vocab vocab = read_bpe_vocab_json(vocab_path);
  const auto merges = read_bpe_merges(merges_path);
  BpeOptions options;
  options.source = merges_path;
  const bool has_eot = vocab.find("<|endoftext|>").has_value();
  auto tok = std::make_shared<ByteLevelBpeTokenizer>(std::move(vocab), merges, options);
  if (has_eot) tok->add_special_tokens({"<|endoftext|>"});
  return tok;
}

}  // namespace mt::tokenizers
