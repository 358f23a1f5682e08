#include "meshtrain/tokenizers/metaspace_bpe.h"

#include "meshtrain/core/error.h"
#include "meshtrain/tokenizers/unicode.h"

namespace mt::tokenizers {
namespace {

// "<0x0A>": HF formats the byte as {:#04X}.
std::string byte_token(int b) {
  static const char* hex = "0123456789ABCDEF";
  return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

}  // namespace

MetaspaceBpeTokenizer::MetaspaceBpeTokenizer(Vocab vocab, const std::vector<BpeMerge>& merges,
                                             MetaspaceBpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  MT_CHECK(vocab_.size() > 0, "[tokenizer] ", options_.source, ": BPE vocabulary is empty");
  merges_ = BpeMergeTable(vocab_, merges, options_.source);
  if (options_.unk_token) {
    unk_id_ = vocab_.find(*options_.unk_token);
    MT_CHECK(unk_id_.has_value(), "[tokenizer] ", options_.source, ": unk_token '", *options_.unk_token,
             "' is not in model.vocab");
  }
  for (int b = 0; b < 256; ++b) byte_token_id_[size_t(b)] = vocab_.find(byte_token(b)).value_or(-1);
  if (options_.metaspace)
    MT_CHECK(unicode::char_count(options_.metaspace->replacement) == 1, "[tokenizer] ", options_.source,
             ": Metaspace replacement '", options_.metaspace->replacement, "' must be one character");
}

void MetaspaceBpeTokenizer::Aligned::prepend(std::string_view s) {
  text.insert(0, s);
  const uint32_t b = begin[0], e = end[0];
  begin.insert(begin.begin(), s.size(), b);
  end.insert(end.begin(), s.size(), e);
}

void MetaspaceBpeTokenizer::Aligned::replace(std::string_view pattern, std::string_view content) {
  if (pattern.empty() || text.find(pattern) == std::string::npos) return;
  Aligned next;
  next.text.reserve(text.size() + text.size() / 4);
  auto emit = [&](std::string_view s, uint32_t b, uint32_t e) {
    next.text.append(s);
    next.begin.insert(next.begin.end(), s.size(), b);
    next.end.insert(next.end.end(), s.size(), e);
  };
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, pattern.size(), pattern) == 0) {
      emit(content, begin[i], end[i + pattern.size() - 1]);
      i += pattern.size();
    } else {
      emit(std::string_view(text).substr(i, 1), begin[i], end[i]);
      ++i;
    }
  }
  *this = std::move(next);
}

void MetaspaceBpeTokenizer::normalize(std::string_view text, Aligned& out) const {
  out.text.assign(text);
  out.begin.resize(text.size());
  out.end.resize(text.size());
  for (uint32_t i = 0; i < text.size(); ++i) out.begin[i] = i, out.end[i] = i + 1;
  for (const NormalizeStep& step : options_.normalizer) {
    if (out.text.empty()) return;  // Prepend leaves an empty string empty; Replace has nothing to do
    if (step.prepend) out.prepend(step.content);
    else out.replace(step.pattern, step.content);
  }
}

std::string MetaspaceBpeTokenizer::normalize_for_matching(std::string_view content) const {
  Aligned a;
  normalize(content, a);
  return a.text;
}

void MetaspaceBpeTokenizer::encode_word(std::string_view w, BpeWord& word) const {
  word.clear();
  if (options_.ignore_merges)
    if (auto id = vocab_.find(w)) {
      word.emplace_back(*id, uint32_t(w.size()));
      return;
    }
  std::optional<std::pair<int32_t, uint32_t>> unk;  // the pending (possibly fused) unknown token
  uint32_t cp;
  for (size_t i = 0; i < w.size();) {
    const uint32_t len = uint32_t(unicode::decode_utf8(w, i, cp));
    const std::string_view ch = w.substr(i, len);
    i += len;
    if (auto id = vocab_.find(ch)) {
      if (unk) word.push_back(*unk), unk.reset();
      word.emplace_back(*id, len);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all &= byte_token_id_[b] >= 0;
      if (all) {
        // A pending unknown token is not flushed first: HF adds it after these bytes.
        for (unsigned char b : ch) word.emplace_back(byte_token_id_[b], 1u);
        continue;
      }
    }
    if (!unk_id_) continue;  // no unknown token: the character produces nothing, as in HF
    if (unk && options_.fuse_unk) {
      unk->second += len;
    } else {
      if (unk) word.push_back(*unk);
      unk = std::pair<int32_t, uint32_t>{*unk_id_, len};
    }
  }
  if (unk) word.push_back(*unk);
  merges_.apply(word);
}

void MetaspaceBpeTokenizer::encode_piece(const Aligned& norm, size_t from, size_t to, int64_t base, int32_t type_id,
                                         int32_t sequence_id, Encoding& out) const {
  if (from >= to) return;  // HF drops empty pieces before pre-tokenizing
  thread_local Aligned piece;
  piece.text.assign(norm.text, from, to - from);
  piece.begin.assign(norm.begin.begin() + from, norm.begin.begin() + to);
  piece.end.assign(norm.end.begin() + from, norm.end.begin() + to);
  std::vector<size_t> word_starts{0};
  if (options_.metaspace) {
    const MetaspaceOptions& m = *options_.metaspace;
    piece.replace(" ", m.replacement);
    // "first" prepends only to the piece that starts the input (not after an added token).
    const bool starts_input = base + int64_t(piece.begin[0]) == 0;
    if (piece.text.compare(0, m.replacement.size(), m.replacement) != 0 &&
        (m.prepend_scheme == PrependScheme::always || (m.prepend_scheme == PrependScheme::first && starts_input)))
      piece.prepend(m.replacement);
    if (m.split)  // each replacement character starts a word (merged with what follows it)
      for (size_t at = piece.text.find(m.replacement, 1); at != std::string::npos;
           at = piece.text.find(m.replacement, at + 1))
        word_starts.push_back(at);
  }
  word_starts.push_back(piece.text.size());
  thread_local BpeWord word;
  for (size_t k = 0; k + 1 < word_starts.size(); ++k) {
    const size_t wb = word_starts[k], we = word_starts[k + 1];
    if (wb == we) continue;
    encode_word(std::string_view(piece.text).substr(wb, we - wb), word);
    size_t at = wb;
    for (const auto& [id, len] : word) {
      const Offsets o{base + piece.begin[at], base + piece.end[at + len - 1]};
      out.push_back(id, *vocab_.token(id), o, type_id, sequence_id, false);
      at += len;
    }
  }
}

void MetaspaceBpeTokenizer::tokenize_segment(std::string_view text, int64_t base, int32_t type_id,
                                             int32_t sequence_id, Encoding& out) const {
  thread_local Aligned norm;
  normalize(text, norm);
  if (!added_.has_pass(true)) return encode_piece(norm, 0, norm.text.size(), base, type_id, sequence_id, out);
  // Added tokens with normalized=true are found in the normalized text.
  std::vector<Split> splits;
  added_.split(norm.text, true, splits);
  for (const auto& s : splits) {
    if (s.id < 0) {
      encode_piece(norm, s.begin, s.end, base, type_id, sequence_id, out);
      continue;
    }
    const Offsets o{base + norm.begin[s.begin], base + norm.end[s.end - 1]};
    out.push_back(s.id, added_.token_string(s.id), o, type_id, sequence_id, false);
  }
}

std::string MetaspaceBpeTokenizer::decode_tokens(const std::vector<int32_t>&,
                                                 const std::vector<std::string_view>& tokens) const {
  return options_.decoder.decode(tokens);
}

}  // namespace mt::tokenizers
