#include "meshtrain/serve/text_stream.h"

#include <algorithm>

namespace mt::serve {

namespace {

constexpr size_t kContextTokens = 4;
const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD: what decoding an incomplete character gives

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Bytes at the end of s that begin a UTF-8 character without all of its bytes yet (a
// byte-level token may end inside a character; decoders that keep raw bytes show it so).
size_t incomplete_tail(const std::string& s) {
  for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

// Moves `end` back to the start of a UTF-8 character.
size_t char_boundary(const std::string& s, size_t end) {
  while (end > 0 && end < s.size() && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return end;
}

}  // namespace

TextStream::TextStream(const tokenizers::Tokenizer& tokenizer, const std::vector<int64_t>& prompt,
                       std::vector<std::string> stops)
    : tokenizer_(tokenizer), stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const std::string& s : stops_) longest_stop_ = std::max(longest_stop_, s.size());
  const size_t n = std::min(prompt.size(), kContextTokens);
  for (size_t i = prompt.size() - n; i < prompt.size(); ++i) ids_.push_back(int32_t(prompt[i]));
  stable_ = ids_.size();
}

std::string TextStream::decoded() const {
  const size_t from = stable_ >= kContextTokens ? stable_ - kContextTokens : 0;
  const std::vector<int32_t> context(ids_.begin() + int64_t(from), ids_.begin() + int64_t(stable_));
  const std::vector<int32_t> window(ids_.begin() + int64_t(from), ids_.end());
  const std::string context_text = tokenizer_.decode(context, true), all = tokenizer_.decode(window, true);
  // The new tokens' text is what they add after the context's.
  if (all.compare(0, context_text.size(), context_text) == 0) return settled_ + all.substr(context_text.size());
  const std::vector<int32_t> fresh(ids_.begin() + int64_t(stable_), ids_.end());
  return settled_ + tokenizer_.decode(fresh, true);
}

std::string TextStream::release_up_to(size_t end, const std::string& text) {
  // Released text is never taken back: a decoder that rewrites earlier text (none of ours
  // does) would only see its later text appended.
  if (end <= released_.size() || text.compare(0, released_.size(), released_) != 0) return "";
  std::string fresh = text.substr(released_.size(), end - released_.size());
  released_ += fresh;
  return fresh;
}

std::string TextStream::push(int64_t token) {
  if (stopped_) return "";
  ids_.push_back(int32_t(token));
  const std::string text = decoded();
  // The earliest stop string ends the text (one may span tokens). The settled text was
  // searched when it settled: only a stop reaching past its end can be new.
  const size_t search_from = settled_.size() > longest_stop_ ? settled_.size() - longest_stop_ : 0;
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, text.find(s, search_from));
  if (cut != std::string::npos) {
    stopped_ = true;
    return release_up_to(cut, text);
  }
  if (ends_with(text, kReplacement)) return "";  // a character still incomplete
  if (incomplete_tail(text) == 0) {
    settled_ = text;
    stable_ = ids_.size();
  }
  // Hold back the longest tail that a stop string begins with.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  const size_t end = std::min(text.size() - hold, text.size() - incomplete_tail(text));
  return release_up_to(char_boundary(text, end), text);
}

std::string TextStream::finish() {
  if (stopped_) return "";
  const std::string text = decoded();
  return release_up_to(text.size(), text);
}

std::string token_text(const tokenizers::Tokenizer& tokenizer, int64_t token) {
  const int32_t id = int32_t(token);
  return tokenizer.decode(std::vector<int32_t>{id}, false);
}

}  // namespace mt::serve
