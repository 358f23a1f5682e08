#include "meshtrain/tokenizers/unicode.h"

#include <utf8proc.h>

namespace mt::tokenizers::unicode {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty() || s.find(from) == std::string::npos) return;
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0;;) {
    const size_t at = s.find(from, i);
    out.append(s, i, at == std::string::npos ? std::string::npos : at - i);
    if (at == std::string::npos) break;
    out.append(to);
    i = at + from.size();
  }
  s = std::move(out);
}

size_t char_count(std::string_view text) {
  size_t count = 0;
  uint32_t cp;
  for (size_t i = 0; i < text.size(); ++count) i += decode_utf8(text, i, cp);
  return count;
}

bool is_whitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

static int category(uint32_t cp) { return utf8proc_category(utf8proc_int32_t(cp)); }

bool is_other(uint32_t cp) {
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CS:
      return true;
    default:
      return false;
  }
}

bool is_punctuation(uint32_t cp) {
  const int c = category(cp);
  return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

bool is_letter(uint32_t cp) {
  const int c = category(cp);
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

bool is_number(uint32_t cp) {
  const int c = category(cp);
  return c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO;
}

bool is_mark_nonspacing(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_MN; }

bool is_mark(uint32_t cp) {
  const int c = category(cp);
  return c >= UTF8PROC_CATEGORY_MN && c <= UTF8PROC_CATEGORY_ME;
}

int combining_class(uint32_t cp) { return utf8proc_get_property(utf8proc_int32_t(cp))->combining_class; }

bool is_cjk(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

int nfd(uint32_t cp, uint32_t* out, int capacity) {
  int boundclass = UTF8PROC_BOUNDCLASS_START;
  utf8proc_int32_t buf[32];
  const auto n = utf8proc_decompose_char(utf8proc_int32_t(cp), buf, 32, UTF8PROC_DECOMPOSE, &boundclass);
  if (n <= 0 || n > capacity || n > 32) {
    out[0] = cp;
    return 1;
  }
  for (int k = 0; k < n; ++k) out[k] = uint32_t(buf[k]);
  return int(n);
}

int to_lower(uint32_t cp, uint32_t out[2]) {
  if (cp < 0x80) {
    out[0] = (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    return 1;
  }
  // The one unconditional multi-code-point lowercase mapping in SpecialCasing.txt.
  if (cp == 0x130) {
    out[0] = 'i';
    out[1] = 0x307;
    return 2;
  }
  out[0] = uint32_t(utf8proc_tolower(utf8proc_int32_t(cp)));
  return 1;
}

std::string utf8_lossy(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  std::string out;
  out.reserve(n);
  size_t i = 0;
  while (i < n) {
    const unsigned c = s[i];
    if (c < 0x80) {
      out.push_back(char(c));
      ++i;
      continue;
    }
    int need = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    size_t k = 1;
    bool ok = need > 0;
    for (int j = 0; ok && j < need; ++j, ++k) {
      const unsigned b = i + k < n ? s[i + k] : 0x100;
      const unsigned l = j == 0 ? lo : 0x80, h = j == 0 ? hi : 0xBF;
      if (b < l || b > h) ok = false;
    }
    if (ok) {
      out.append(bytes.substr(i, k));
      i += k;
    } else {
      // k - 1 bytes (the lead plus the valid continuation bytes) form one maximal subpart.
      out += "\xEF\xBF\xBD";
      i += need > 0 ? k - 1 : 1;
    }
  }
  return out;
}

}  // namespace mt::tokenizers::unicode
