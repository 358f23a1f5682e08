#include "meshtrain/tokenizers/wordpiece.h"

#include <algorithm>
#include <fstream>

#include "meshtrain/core/error.h"
#include "meshtrain/tokenizers/unicode.h"

namespace mt::tokenizers {
namespace {

// ASCII classes of the BERT pre-tokenizer: 1 = whitespace, 2 = punctuation (Rust's
// is_ascii_punctuation, which also covers symbols such as $ + < = > ^ ` | ~).
struct AsciiClass {
  uint8_t cls[128] = {};
  AsciiClass() {
    for (int c : {' ', '\t', '\n', '\v', '\f', '\r'}) cls[c] = 1;
    for (int c = 33; c < 127; ++c)
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) cls[c] = 2;
  }
};
const AsciiClass kAscii;

bool is_bert_punctuation(uint32_t cp) { return cp < 128 ? kAscii.cls[cp] == 2 : unicode::is_punctuation(cp); }

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(Vocab vocab, WordPieceOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  MT_CHECK(vocab_.size() > 0, "[tokenizer] WordPiece vocabulary is empty");
  auto unk = vocab_.find(options_.unk_token);
  MT_CHECK(unk.has_value(), "[tokenizer] WordPiece unk token '", options_.unk_token, "' is not in the vocabulary");
  unk_id_ = *unk;
  if (options_.normalizer)
    strip_accents_ = options_.normalizer->strip_accents.value_or(options_.normalizer->lowercase);
  added_.set_normalized_pass(handles_normalized_added_tokens());
}

void WordPieceTokenizer::normalize(std::string_view text, std::string& out, std::vector<uint32_t>& src) const {
  out.clear();
  src.clear();
  out.reserve(text.size() + 8);
  src.reserve(text.size() + 8);
  if (!options_.normalizer) {
    out.assign(text);
    for (uint32_t i = 0; i < text.size(); ++i) src.push_back(i);
    return;
  }
  const BertNormalizerOptions& o = *options_.normalizer;
  const bool ascii = std::all_of(text.begin(), text.end(), [](char c) { return uint8_t(c) < 0x80; });
  if (ascii) {
    // Fast path: no CJK, no accents, and ASCII lower-casing.
    for (uint32_t i = 0; i < text.size(); ++i) {
      char c = text[i];
      if (o.clean_text) {
        if (c == '\t' || c == '\n' || c == '\r') c = ' ';
        else if (uint8_t(c) < 0x20 || c == 0x7F) continue;  // control characters (\v and \f too)
      }
      if (o.lowercase && c >= 'A' && c <= 'Z') c = char(c + 32);
      out.push_back(c);
      src.push_back(i);
    }
    return;
  }
  std::vector<std::pair<uint32_t, uint32_t>> chars;  // (code point, source byte offset)
  chars.reserve(text.size() + 8);
  uint32_t cp;
  for (size_t i = 0; i < text.size();) {
    const size_t len = unicode::decode_utf8(text, i, cp);
    const auto at = uint32_t(i);
    i += len;
    if (o.clean_text) {
      const bool control = cp != '\t' && cp != '\n' && cp != '\r' && unicode::is_other(cp);
      if (cp == 0 || cp == 0xFFFD || control) continue;
      if (unicode::is_whitespace(cp)) cp = ' ';
    }
    if (o.handle_chinese_chars && unicode::is_cjk(cp)) {
      chars.push_back({' ', at});
      chars.push_back({cp, at});
      chars.push_back({' ', at});
    } else {
      chars.push_back({cp, at});
    }
  }
  if (strip_accents_) {
    std::vector<std::pair<uint32_t, uint32_t>> nfd;
    nfd.reserve(chars.size() + 8);
    uint32_t buf[32];
    for (const auto& [c, at] : chars) {
      if (c < 0x80) {
        nfd.push_back({c, at});
        continue;
      }
      const int n = unicode::nfd(c, buf, 32);
      for (int k = 0; k < n; ++k) nfd.push_back({buf[k], at});
    }
    // Canonical ordering: runs of combining marks are sorted by combining class.
    for (size_t i = 0; i < nfd.size();) {
      if (nfd[i].first < 0x300 || unicode::combining_class(nfd[i].first) == 0) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < nfd.size() && nfd[j].first >= 0x300 && unicode::combining_class(nfd[j].first) != 0) ++j;
      std::stable_sort(nfd.begin() + std::ptrdiff_t(i), nfd.begin() + std::ptrdiff_t(j), [](const auto& a, const auto& b) {
        return unicode::combining_class(a.first) < unicode::combining_class(b.first);
      });
      i = j;
    }
    chars.clear();
    for (const auto& c : nfd)
      if (c.first < 0x300 || !unicode::is_mark_nonspacing(c.first)) chars.push_back(c);
  }
  uint32_t lower[2];
  for (const auto& [c, at] : chars) {
    const int n = o.lowercase ? unicode::to_lower(c, lower) : (lower[0] = c, 1);
    for (int k = 0; k < n; ++k) {
      const size_t before = out.size();
      unicode::append_utf8(out, lower[k]);
      src.insert(src.end(), out.size() - before, at);
    }
  }
}

std::string WordPieceTokenizer::normalize_for_matching(std::string_view content) const {
  std::string out;
  std::vector<uint32_t> src;
  normalize(content, out, src);
  return out;
}

void WordPieceTokenizer::tokenize_segment(std::string_view text, int64_t base, int32_t type_id, int32_t sequence_id,
                                          Encoding& out) const {
  thread_local std::string norm;
  thread_local std::vector<uint32_t> src;
  normalize(text, norm, src);
  if (!added_.has_pass(true)) {
    tokenize_normalized(text, norm, src, 0, norm.size(), base, type_id, sequence_id, out);
    return;
  }
  // Added tokens with normalized=true are found in the normalized text.
  std::vector<Split> splits;
  added_.split(norm, true, splits);
  for (const auto& s : splits) {
    if (s.id < 0) {
      tokenize_normalized(text, norm, src, s.begin, s.end, base, type_id, sequence_id, out);
      continue;
    }
    uint32_t cp;
    const int64_t b = src[s.begin], e = src[s.end - 1] + int64_t(unicode::decode_utf8(text, src[s.end - 1], cp));
    out.push_back(s.id, added_.token_string(s.id), {base + b, base + e}, type_id, sequence_id, false);
  }
}

void WordPieceTokenizer::tokenize_normalized(std::string_view original, std::string_view norm,
                                             const std::vector<uint32_t>& src, size_t begin, size_t end,
                                             int64_t base, int32_t type_id, int32_t sequence_id,
                                             Encoding& out) const {
  // BertPreTokenizer: split on whitespace (dropped) and punctuation (kept, one per word).
  size_t word = std::string_view::npos;
  uint32_t cp;
  for (size_t i = begin; i < end;) {
    const unsigned char c = norm[i];
    size_t len = 1;
    int cls;
    if (c < 0x80) {
      cls = kAscii.cls[c];
    } else {
      len = unicode::decode_utf8(norm, i, cp);
      cls = unicode::is_whitespace(cp) ? 1 : is_bert_punctuation(cp) ? 2 : 0;
    }
    if (cls != 0) {
      if (word != std::string_view::npos) wordpiece(original, norm, src, word, i, base, type_id, sequence_id, out);
      word = std::string_view::npos;
      if (cls == 2) wordpiece(original, norm, src, i, i + len, base, type_id, sequence_id, out);
    } else if (word == std::string_view::npos) {
      word = i;
    }
    i += len;
  }
  if (word != std::string_view::npos) wordpiece(original, norm, src, word, end, base, type_id, sequence_id, out);
}

void WordPieceTokenizer::wordpiece(std::string_view original, std::string_view norm, const std::vector<uint32_t>& src,
                                   size_t begin, size_t end, int64_t base, int32_t type_id, int32_t sequence_id,
                                   Encoding& out) const {
  uint32_t cp;
  auto offsets = [&](size_t b, size_t e) {
    const uint32_t last = src[e - 1];
    return Offsets{base + src[b], base + last + int64_t(unicode::decode_utf8(original, last, cp))};
  };
  const std::string_view w = norm.substr(begin, end - begin);
  size_t chars = 0;
  for (unsigned char c : w) chars += (c & 0xC0) != 0x80;
  if (chars > options_.max_input_chars_per_word) {
    out.push_back(unk_id_, options_.unk_token, offsets(begin, end), type_id, sequence_id, false);
    return;
  }
  // Greedy longest-match-first; a word with any uncovered piece becomes a single [UNK].
  thread_local std::string key;
  thread_local std::vector<std::pair<int32_t, std::pair<size_t, size_t>>> pieces;
  pieces.clear();
  size_t start = 0;
  while (start < w.size()) {
    size_t stop = w.size();
    std::optional<int32_t> id;
    while (start < stop) {
      if (start == 0) {
        id = vocab_.find(w.substr(0, stop));
      } else {
        key.assign(options_.continuing_subword_prefix);
        key.append(w.substr(start, stop - start));
        id = vocab_.find(key);
      }
      if (id) break;
      do --stop;
      while (stop > start && (uint8_t(w[stop]) & 0xC0) == 0x80);
    }
    if (!id) {
      out.push_back(unk_id_, options_.unk_token, offsets(begin, end), type_id, sequence_id, false);
      return;
    }
    pieces.push_back({*id, {start, stop}});
    start = stop;
  }
  for (const auto& [id, range] : pieces)
    out.push_back(id, *vocab_.token(id), offsets(begin + range.first, begin + range.second), type_id, sequence_id,
                  false);
}

std::string WordPieceTokenizer::decode_tokens(const std::vector<int32_t>&,
                                              const std::vector<std::string_view>& tokens) const {
  std::string out;
  if (!options_.decoder) {
    // No WordPiece decoder configured: tokens joined by spaces.
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  const std::string& prefix = options_.decoder_prefix;
  std::string piece;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string_view t = tokens[i];
    if (i == 0) piece.assign(t);
    else if (!prefix.empty() && t.substr(0, prefix.size()) == prefix) piece.assign(t.substr(prefix.size()));
    else {
      piece.assign(1, ' ');
      piece.append(t);
    }
    if (options_.decoder_cleanup) {
      // Applied per token, as Hugging Face's decoder does.
      unicode::replace_all(piece, " .", ".");
      unicode::replace_all(piece, " ?", "?");
      unicode::replace_all(piece, " !", "!");
      unicode::replace_all(piece, " ,", ",");
      unicode::replace_all(piece, " ' ", "'");
      unicode::replace_all(piece, " n't", "n't");
      unicode::replace_all(piece, " 'm", "'m");
      unicode::replace_all(piece, " do not", " don't");
      unicode::replace_all(piece, " 's", "'s");
      unicode::replace_all(piece, " 've", "'ve");
      unicode::replace_all(piece, " 're", "'re");
    }
    out += piece;
  }
  return out;
}

bool vocab_is_cased(const Vocab& vocab) {
  for (const auto& [token, id] : vocab.map()) {
    if (token.size() >= 2 && token.front() == '[' && token.back() == ']') continue;
    for (char c : token)
      if (c >= 'A' && c <= 'Z') return true;
  }
  return false;
}

std::shared_ptr<WordPieceTokenizer> load_wordpiece_vocab(const std::string& path, std::optional<bool> lowercase,
                                                         std::optional<bool> strip_accents, bool handle_chinese_chars) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "[tokenizer] cannot open WordPiece vocabulary '", path, "'");
  Vocab vocab;
  std::string line;
  int32_t id = 0;
  while (std::getline(in, line)) {
    // Like Hugging Face: each line is one token with trailing whitespace trimmed.
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r' || line.back() == '\n' ||
                             line.back() == '\v' || line.back() == '\f'))
      line.pop_back();
    vocab.add(line, id++);
  }
  MT_CHECK(vocab.size() > 0, "[tokenizer] WordPiece vocabulary '", path, "' is empty");
  WordPieceOptions options;
  options.normalizer->lowercase = lowercase.value_or(!vocab_is_cased(vocab));
  options.normalizer->strip_accents = strip_accents;
  options.normalizer->handle_chinese_chars = handle_chinese_chars;
  MT_CHECK(vocab.find(options.unk_token).has_value(), "[tokenizer] ", path, ": the unknown token '", options.unk_token,
           "' is not in the vocabulary");
  for (const char* t : {"[CLS]", "[SEP]"})
    MT_CHECK(vocab.find(t).has_value(), "[tokenizer] ", path, ": the special token '", t,
             "' BERT's template needs is not in the vocabulary");
  const int32_t cls = *vocab.find("[CLS]"), sep = *vocab.find("[SEP]");
  std::vector<std::string> specials;
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"})
    if (vocab.find(t)) specials.push_back(t);
  auto tok = std::make_shared<WordPieceTokenizer>(std::move(vocab), std::move(options));
  tok->add_special_tokens(specials);
  tok->set_post_processor(TemplateProcessing::bert("[CLS]", cls, "[SEP]", sep));
  return tok;
}

}  // namespace mt::tokenizers
