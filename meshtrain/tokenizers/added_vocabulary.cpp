#include "meshtrain/tokenizers/added_vocabulary.h"

#include <algorithm>

#include "meshtrain/tokenizers/unicode.h"

namespace mt::tokenizers {

void AddedVocabulary::add(AddedToken token, std::string normalized_pattern) {
  if (token.content.empty()) return;
  auto it = by_content_.find(token.content);
  if (it != by_content_.end()) {
    tokens_[it->second] = std::move(token);
    normalized_patterns_[it->second] = std::move(normalized_pattern);
  } else {
    by_content_.emplace(token.content, tokens_.size());
    tokens_.push_back(std::move(token));
    normalized_patterns_.push_back(std::move(normalized_pattern));
  }
  rebuild();
}

void AddedVocabulary::rebuild() {
  by_id_.clear();
  special_ids_.clear();
  for (auto& pass : pass_) {
    pass.patterns.clear();
    for (auto& v : pass.by_first_byte) v.clear();
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const auto& t = tokens_[i];
    by_id_[t.id] = i;
    if (t.special) special_ids_.insert(t.id);
    const bool normalized = t.normalized && normalized_pass_;
    const std::string& pattern = normalized ? normalized_patterns_[i] : t.content;
    if (!pattern.empty()) pass_[normalized ? 1 : 0].patterns.emplace_back(pattern, i);
  }
  for (auto& pass : pass_) {
    for (uint32_t k = 0; k < pass.patterns.size(); ++k)
      pass.by_first_byte[uint8_t(pass.patterns[k].first[0])].push_back(k);
    // Longest first, so the first hit at a position is the leftmost-longest match.
    for (auto& v : pass.by_first_byte)
      std::stable_sort(v.begin(), v.end(), [&](uint32_t a, uint32_t b) {
        return pass.patterns[a].first.size() > pass.patterns[b].first.size();
      });
  }
}

void AddedVocabulary::set_normalized_pass(bool enabled) {
  normalized_pass_ = enabled;
  rebuild();
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

const std::string& AddedVocabulary::token_string(int32_t id) const {
  const size_t i = by_id_.at(id);
  return tokens_[i].normalized ? normalized_patterns_[i] : tokens_[i].content;
}

const AddedToken* AddedVocabulary::find_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

namespace {

// The regex crate's \w: alphabetic, marks, decimal numbers and connector punctuation.
bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  return unicode::is_letter(cp) || unicode::is_mark(cp) || unicode::is_number(cp);
}

// The last code point of text[0, end).
uint32_t last_char(std::string_view text, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (uint8_t(text[b]) & 0xC0) == 0x80 && end - b < 4) --b;
  uint32_t cp;
  unicode::decode_utf8(text, b, cp);
  return cp;
}

}  // namespace

void AddedVocabulary::split(std::string_view text, bool normalized_pass, std::vector<Split>& out) const {
  out.clear();
  const Pass& pass = pass_[normalized_pass ? 1 : 0];
  size_t start_offset = 0;
  if (!pass.patterns.empty()) {
    size_t i = 0;
    while (i < text.size()) {
      const auto& cands = pass.by_first_byte[uint8_t(text[i])];
      const std::pair<std::string, size_t>* hit = nullptr;
      for (uint32_t k : cands) {
        const auto& p = pass.patterns[k].first;
        if (text.size() - i >= p.size() && text.compare(i, p.size(), p) == 0) {
          hit = &pass.patterns[k];
          break;
        }
      }
      if (!hit) {
        ++i;
        continue;
      }
      const AddedToken& tok = tokens_[hit->second];
      size_t start = i, stop = i + hit->first.size();
      i = stop;  // matches never overlap, even the ones single_word discards
      if (tok.single_word) {
        const bool start_ok = start == 0 || !is_word_char(last_char(text, start));
        uint32_t next = 0;
        if (stop < text.size()) unicode::decode_utf8(text, stop, next);
        const bool stop_ok = stop == text.size() || !is_word_char(next);
        if (!start_ok || !stop_ok) continue;
      }
      if (tok.lstrip) {
        size_t s = start;
        while (s > start_offset && unicode::is_whitespace(last_char(text, s))) {
          const uint32_t cp = last_char(text, s);
          s -= cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        }
        start = s;
      }
      if (tok.rstrip) {
        uint32_t cp;
        while (stop < text.size()) {
          const size_t len = unicode::decode_utf8(text, stop, cp);
          if (!unicode::is_whitespace(cp)) break;
          stop += len;
        }
        i = stop;
      }
      if (start_offset < start) out.push_back({start_offset, start, -1});
      out.push_back({start, stop, tok.id});
      start_offset = stop;
    }
  }
  if (start_offset < text.size() || out.empty()) out.push_back({start_offset, text.size(), -1});
}

}  // namespace mt::tokenizers
