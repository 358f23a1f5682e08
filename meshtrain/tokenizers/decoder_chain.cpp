#include "meshtrain/tokenizers/decoder_chain.h"

#include <algorithm>

#include "meshtrain/tokenizers/unicode.h"

namespace mt::tokenizers {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Consecutive byte tokens become the text they spell; bytes that are not valid UTF-8
// become one U+FFFD each (not one per invalid sequence), as HF's ByteFallback does.
std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  std::string bytes;
  auto flush = [&] {
    if (bytes.empty()) return;
    if (unicode::utf8_lossy(bytes) == bytes) out.push_back(bytes);
    else
      for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
    bytes.clear();
  };
  for (auto& t : tokens) {
    const int b = byte_fallback_value(t);
    if (b >= 0) {
      bytes.push_back(char(b));
      continue;
    }
    flush();
    out.push_back(std::move(t));
  }
  flush();
  return out;
}

std::string strip(const std::string& token, uint32_t ch, size_t start, size_t stop) {
  std::vector<std::pair<size_t, uint32_t>> chars;  // (byte offset, code point)
  uint32_t cp;
  for (size_t i = 0; i < token.size();) {
    const size_t len = unicode::decode_utf8(token, i, cp);
    chars.emplace_back(i, cp);
    i += len;
  }
  size_t first = 0, last = chars.size();
  while (first < std::min(start, chars.size()) && chars[first].second == ch) ++first;
  for (size_t k = 0; k < stop && last > first && chars[last - 1].second == ch; ++k) --last;
  const size_t b = first < chars.size() ? chars[first].first : token.size();
  const size_t e = last < chars.size() ? chars[last].first : token.size();
  return token.substr(b, e - b);
}

}  // namespace

int byte_fallback_value(std::string_view t) {
  // HF parses the two characters with u8::from_str_radix, which also takes a '+' sign.
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  if (t[3] == '+') return hex_digit(t[4]);
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

DecodeStep DecodeStep::replace_with(std::string pattern, std::string content) {
  DecodeStep s;
  s.kind = Kind::replace;
  s.pattern = std::move(pattern);
  s.content = std::move(content);
  return s;
}
DecodeStep DecodeStep::byte_fallback_step() {
  DecodeStep s;
  s.kind = Kind::byte_fallback;
  return s;
}
DecodeStep DecodeStep::fuse_step() {
  DecodeStep s;
  s.kind = Kind::fuse;
  return s;
}
DecodeStep DecodeStep::strip_step(uint32_t ch, size_t start, size_t stop) {
  DecodeStep s;
  s.kind = Kind::strip;
  s.strip_char = ch;
  s.start = start;
  s.stop = stop;
  return s;
}
DecodeStep DecodeStep::metaspace_step(std::string replacement, bool drop_first_replacement) {
  DecodeStep s;
  s.kind = Kind::metaspace;
  s.replacement = std::move(replacement);
  s.drop_first_replacement = drop_first_replacement;
  return s;
}

std::string DecoderChain::decode(const std::vector<std::string_view>& in) const {
  std::string joined;
  if (steps_.empty()) {
    for (size_t i = 0; i < in.size(); ++i) (joined += i ? " " : "") += in[i];
    return joined;
  }
  std::vector<std::string> tokens(in.begin(), in.end());
  for (const DecodeStep& s : steps_) {
    switch (s.kind) {
      case DecodeStep::Kind::replace:
        for (auto& t : tokens) unicode::replace_all(t, s.pattern, s.content);
        break;
      case DecodeStep::Kind::byte_fallback:
        tokens = byte_fallback(std::move(tokens));
        break;
      case DecodeStep::Kind::fuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case DecodeStep::Kind::strip:
        for (auto& t : tokens) t = strip(t, s.strip_char, s.start, s.stop);
        break;
      case DecodeStep::Kind::metaspace:
        // Every replacement character in the first token is dropped, not only a leading one.
        for (size_t i = 0; i < tokens.size(); ++i)
          unicode::replace_all(tokens[i], s.replacement, i == 0 && s.drop_first_replacement ? "" : " ");
        break;
    }
  }
  for (const auto& t : tokens) joined += t;
  return joined;
}

}  // namespace mt::tokenizers
