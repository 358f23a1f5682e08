#pragma once
// Unicode helpers shared by the tokenizers: UTF-8 decoding and the character classes
// Hugging Face `tokenizers` uses (Rust's char::is_whitespace, Unicode general categories).
#include <cstdint>
#include <string>
#include <string_view>

namespace mt::tokenizers::unicode {

// Decodes the code point starting at text[i]. Returns its length in bytes (>= 1); an
// invalid or truncated sequence decodes as U+FFFD with length 1, so every byte is consumed.
inline size_t decode_utf8(std::string_view text, size_t i, uint32_t& cp) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const unsigned c = s[i];
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  auto cont = [&](size_t k) { return i + k < n && (s[i + k] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF && cont(1)) {
    cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
    return 2;
  }
  if (c >= 0xE0 && c <= 0xEF && cont(1) && cont(2)) {
    cp = ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) return 3;
  } else if (c >= 0xF0 && c <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    cp = ((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
    if (cp >= 0x10000 && cp <= 0x10FFFF) return 4;
  }
  cp = 0xFFFD;
  return 1;
}

inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Replaces every non-overlapping `from` in `s` with `to`, left to right (nothing when
// `from` is empty).
void replace_all(std::string& s, std::string_view from, std::string_view to);

// Number of code points (invalid bytes count one each, as decode_utf8 does).
size_t char_count(std::string_view text);

// Rust's char::is_whitespace (the White_Space property); also Oniguruma's \s.
bool is_whitespace(uint32_t cp);
// Control, format, private-use and surrogate code points (Cc, Cf, Co, Cs): what BERT's
// clean-up removes. Unassigned code points (Cn) are kept, as Hugging Face does.
bool is_other(uint32_t cp);
// General category P* (Pc, Pd, Pe, Pf, Pi, Po, Ps).
bool is_punctuation(uint32_t cp);
bool is_letter(uint32_t cp);          // L*
bool is_number(uint32_t cp);          // N*
bool is_mark_nonspacing(uint32_t cp); // Mn
bool is_mark(uint32_t cp);            // M*
int combining_class(uint32_t cp);
// BERT's CJK ideograph ranges (not Hangul, Hiragana or Katakana).
bool is_cjk(uint32_t cp);

// Canonical decomposition of one code point (no reordering); returns the count written.
int nfd(uint32_t cp, uint32_t* out, int capacity);
// Full lowercase mapping of one code point, like Rust's char::to_lowercase (which may
// yield two code points, e.g. U+0130). Returns the count written (1 or 2).
int to_lower(uint32_t cp, uint32_t out[2]);

// Replaces invalid UTF-8 with U+FFFD, one per maximal invalid subpart (like Rust's
// String::from_utf8_lossy and the WHATWG decoder).
std::string utf8_lossy(std::string_view bytes);

}  // namespace mt::tokenizers::unicode
