// UTF-8 text with Python's str semantics for the chat template interpreter: code points,
// whitespace, case mapping (utf8proc's simple mappings), strip/split/splitlines/replace, slices.
#include <utf8proc.h>

#include <algorithm>

#include "meshtrain/serve/chat_template/value.h"

namespace mt::serve::chat_template_detail {

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) {  // invalid byte: keep it as U+FFFD and move on
      cp = 0xFFFD;
      n = 1;
    }
    out.push_back(static_cast<char32_t>(cp));
    p += n;
    left -= n;
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool py_is_linebreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return false;
    default:
      return true;
  }
}

char32_t cp_upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t cp_lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
char32_t cp_title(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }

bool cp_is_cased(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
         cp_upper(c) != c || cp_lower(c) != c;
}

bool cp_is_alpha(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

bool cp_is_digit(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND;
}

bool cp_is_alnum(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cp_is_alpha(c) || cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

namespace {

// The unconditional full case mappings of SpecialCasing.txt that Python applies and utf8proc's
// simple mappings lack (the common ones: sharp s, Latin ligatures, dotted capital I).
struct FullCase {
  char32_t c;
  const char* upper;
  const char* title;
};
constexpr FullCase kFullCase[] = {
    {0x00DF, "SS", "Ss"}, {0xFB00, "FF", "Ff"}, {0xFB01, "FI", "Fi"}, {0xFB02, "FL", "Fl"},  {0xFB03, "FFI", "Ffi"},
    {0xFB04, "FFL", "Ffl"}, {0xFB05, "ST", "St"}, {0xFB06, "ST", "St"}, {0x0149, "\u02BCN", "\u02BCN"},
};

void append_upper(std::string& out, char32_t c, bool title) {
  for (const auto& f : kFullCase)
    if (f.c == c) {
      out += title ? f.title : f.upper;
      return;
    }
  utf8_append(out, title ? cp_title(c) : cp_upper(c));
}

void append_lower(std::string& out, const std::u32string& t, size_t k) {
  const char32_t c = t[k];
  if (c == 0x0130) {  // capital I with dot above -> i + combining dot above
    out += "i\u0307";
    return;
  }
  if (c == 0x03A3) {  // capital sigma: final form at the end of a word
    bool before = false, after = false;
    for (size_t j = k; j-- > 0;)
      if (cp_is_cased(t[j])) {
        before = true;
        break;
      } else if (t[j] != '\'' && t[j] != 0x2019) {
        break;
      }
    for (size_t j = k + 1; j < t.size(); ++j)
      if (cp_is_cased(t[j])) {
        after = true;
        break;
      } else if (t[j] != '\'' && t[j] != 0x2019) {
        break;
      }
    utf8_append(out, before && !after ? 0x03C2 : 0x03C3);
    return;
  }
  utf8_append(out, cp_lower(c));
}

}  // namespace

std::string py_upper(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : utf8_decode(s)) append_upper(out, c, false);
  return out;
}

std::string py_lower(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const std::u32string t = utf8_decode(s);
  for (size_t k = 0; k < t.size(); ++k) append_lower(out, t, k);
  return out;
}

std::string py_title(const std::string& s) {
  std::string out;
  bool previous_cased = false;
  const std::u32string t = utf8_decode(s);
  for (size_t k = 0; k < t.size(); ++k) {
    if (previous_cased) append_lower(out, t, k);
    else append_upper(out, t[k], true);
    previous_cased = cp_is_cased(t[k]);
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out;
  const std::u32string t = utf8_decode(s);
  for (size_t k = 0; k < t.size(); ++k) {
    if (k == 0) append_upper(out, t[k], true);
    else append_lower(out, t, k);
  }
  return out;
}

std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string text = utf8_decode(s);
  const std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
  size_t b = 0, e = text.size();
  if (left)
    while (b < e && strip_it(text[b])) ++b;
  if (right)
    while (e > b && strip_it(text[e - 1])) --e;
  return utf8_encode(text.substr(b, e - b));
}

std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw RuntimeFail("ValueError: empty separator");
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string::npos) break;
      out.push_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.push_back(s.substr(start));
    return out;
  }
  const std::u32string text = utf8_decode(s);
  size_t i = 0;
  const size_t n = text.size();
  while (true) {
    while (i < n && py_isspace(text[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t e = n;
      while (e > i && py_isspace(text[e - 1])) --e;
      out.push_back(utf8_encode(text.substr(i, e - i)));
      break;
    }
    size_t j = i;
    while (j < n && !py_isspace(text[j])) ++j;
    out.push_back(utf8_encode(text.substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> out;
  const std::u32string text = utf8_decode(s);
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    size_t j = i;
    while (j < n && !py_is_linebreak(text[j])) ++j;
    size_t end = j;
    if (j < n) {
      j += (text[j] == '\r' && j + 1 < n && text[j + 1] == '\n') ? 2 : 1;
      if (keepends) end = j;
    }
    out.push_back(utf8_encode(text.substr(i, end - i)));
    i = j;
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    const std::u32string text = utf8_decode(s);
    for (char32_t c : text) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      utf8_append(out, c);
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start).append(with);
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::vector<int64_t> slice_indices(int64_t length, const std::optional<int64_t>& start,
                                   const std::optional<int64_t>& stop, const std::optional<int64_t>& step) {
  const int64_t st = step.value_or(1);
  if (st == 0) throw RuntimeFail("ValueError: slice step cannot be zero");
  const int64_t lower = st > 0 ? 0 : -1;
  const int64_t upper = st > 0 ? length : length - 1;
  auto clamp = [&](const std::optional<int64_t>& v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v;
    if (x < 0) {
      x += length;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  const int64_t b = clamp(start, st > 0 ? lower : upper);
  const int64_t e = clamp(stop, st > 0 ? upper : lower);
  std::vector<int64_t> out;
  if (st > 0)
    for (int64_t k = b; k < e; k += st) out.push_back(k);
  else
    for (int64_t k = b; k > e; k += st) out.push_back(k);
  return out;
}

}  // namespace mt::serve::chat_template_detail
