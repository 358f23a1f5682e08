// The chat template lexer: jinja2's lexer rules for an Environment(trim_blocks=True,
// lstrip_blocks=True) with the default delimiters. Line breaks are normalized to "\n" and one
// trailing newline is dropped (keep_trailing_newline=False); `{%-`/`-%}` strip all whitespace,
// `+` turns lstrip/trim off for that side, trim_blocks eats the newline after a block or comment
// tag, lstrip_blocks the spaces and tabs before a block or comment tag that starts its line.
#include <algorithm>
#include <cstring>

#include "meshtrain/core/error.h"
#include "meshtrain/serve/chat_template/ast.h"

namespace mt::serve::chat_template_detail {

std::string where(const Pos& pos) {
  return "[chat_template] line " + std::to_string(pos.line) + ", column " + std::to_string(pos.column) + ": ";
}

namespace {

// The code point at `pos` (its byte length in *len).
char32_t code_point_at(const std::string& s, size_t pos, size_t* len) {
  const unsigned char c = static_cast<unsigned char>(s[pos]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (pos + n > s.size()) n = 1;
  *len = n;
  if (n == 1) return c;
  char32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + k]) & 0x3F);
  return cp;
}

bool space_at(const std::string& s, size_t pos, size_t* len) {
  return pos < s.size() && py_isspace(code_point_at(s, pos, len));
}

size_t skip_space(const std::string& s, size_t pos) {
  size_t len = 0;
  while (space_at(s, pos, &len)) pos += len;
  return pos;
}

// Python's str.rstrip() of s[0, end): the new end.
size_t rstrip_end(const std::string& s, size_t end) {
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t len = 0;
    if (!py_isspace(code_point_at(s, start, &len)) || start + len != end) break;
    end = start;
  }
  return end;
}

bool starts_with(const std::string& s, size_t pos, const char* what) {
  return s.compare(pos, std::strlen(what), what) == 0;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// `(\d+_)*\d+` at pos: its end, or npos.
size_t match_digits(const std::string& s, size_t pos) {
  if (pos >= s.size() || !is_digit(s[pos])) return std::string::npos;
  while (pos < s.size() && is_digit(s[pos])) ++pos;
  while (pos + 1 < s.size() && s[pos] == '_' && is_digit(s[pos + 1])) {
    ++pos;
    while (pos < s.size() && is_digit(s[pos])) ++pos;
  }
  return pos;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
  }

  std::vector<Token> run() {
    const size_t n = src_.size();
    while (pos_ < n) {
      size_t k = pos_;
      while (true) {
        k = src_.find('{', k);
        if (k == std::string::npos || k + 1 >= n) {
          k = std::string::npos;
          break;
        }
        if (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#') break;
        ++k;
      }
      if (k == std::string::npos) {
        emit_data(src_.substr(pos_), pos_);
        pos_ = n;
        break;
      }
      const char kind = src_[k + 1];
      size_t after = k + 2;
      char sign = 0;
      if (after < n && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      size_t raw_end = std::string::npos;  // the end of a `{% raw %}` tag
      if (kind == '%') {
        const size_t p = skip_space(src_, after);
        if (starts_with(src_, p, "raw")) {
          const size_t q = skip_space(src_, p + 3);
          if (starts_with(src_, q, "-%}"))
            raw_end = skip_space(src_, q + 3);
          else if (starts_with(src_, q, "%}"))
            raw_end = q + 2;
        }
      }
      emit_data(strip_before(src_.substr(pos_, k - pos_), sign, kind != '{'), pos_);
      if (raw_end != std::string::npos) {
        lex_raw(k, raw_end);
      } else if (kind == '#') {
        lex_comment(k, after);
      } else {
        push(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, std::string(src_, k, after - k), k);
        pos_ = after;
        line_starting_ = false;
        lex_tag(kind == '%', k);
      }
    }
    push(Tok::Eof, "", n);
    return std::move(out_);
  }

 private:
  Pos pos_at(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return Pos{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  [[noreturn]] void fail(size_t offset, const std::string& message) const {
    throw mt::Error(where(pos_at(offset)) + message);
  }

  void push(Tok type, std::string text, size_t offset) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.pos = pos_at(offset);
    out_.push_back(std::move(t));
  }

  void emit_data(std::string text, size_t offset) {
    if (!text.empty()) push(Tok::Data, std::move(text), offset);
  }

  // The text before a tag after `{%-` (strip all trailing whitespace) or lstrip_blocks (strip
  // the spaces before a block/comment tag that is alone at the start of its line).
  std::string strip_before(std::string text, char sign, bool block_or_comment) const {
    if (sign == '-') {
      text.resize(rstrip_end(text, text.size()));
    } else if (sign != '+' && block_or_comment) {
      const size_t l_pos = text.rfind('\n') + 1;  // npos + 1 == 0
      if ((l_pos > 0 || line_starting_) && l_pos < text.size() && skip_space(text, l_pos) == text.size())
        text.resize(l_pos);
    }
    return text;
  }

  // The end of a block/comment tag at `pos` ("+%}", "-%}" + whitespace, "%}" + trim_blocks).
  size_t after_block_end(size_t pos) const {
    if (src_[pos] == '+') return pos + 3;
    if (src_[pos] == '-') return skip_space(src_, pos + 3);
    pos += 2;
    if (pos < src_.size() && src_[pos] == '\n') ++pos;  // trim_blocks
    return pos;
  }

  void lex_comment(size_t start, size_t after) {
    const size_t h = src_.find("#}", after);
    if (h == std::string::npos) fail(start, "missing end of comment tag");
    const size_t m = (h > after && (src_[h - 1] == '-' || src_[h - 1] == '+')) ? h - 1 : h;
    pos_ = after_block_end(m);
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  void lex_raw(size_t start, size_t content) {
    line_starting_ = src_[content - 1] == '\n';
    size_t p = content;
    while (true) {
      p = src_.find("{%", p);
      if (p == std::string::npos) fail(start, "missing end of raw directive");
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_space(src_, q);
      if (starts_with(src_, q, "endraw")) {
        q = skip_space(src_, q + 6);
        if (starts_with(src_, q, "+%}") || starts_with(src_, q, "-%}") || starts_with(src_, q, "%}")) {
          emit_data(strip_before(src_.substr(content, p - content), sign, true), content);
          pos_ = after_block_end(q);
          line_starting_ = src_[pos_ - 1] == '\n';
          return;
        }
      }
      p += 2;
    }
  }

  void lex_tag(bool block, size_t start) {
    std::vector<char> balance;
    const size_t n = src_.size();
    while (true) {
      if (pos_ >= n)
        fail(start, std::string("unexpected end of template: the tag is not closed (expected '") +
                        (block ? "%}" : "}}") + "')");
      if (balance.empty()) {
        if (block && (starts_with(src_, pos_, "+%}") || starts_with(src_, pos_, "-%}") || starts_with(src_, pos_, "%}"))) {
          push(Tok::BlockEnd, "%}", pos_);
          pos_ = after_block_end(pos_);
          line_starting_ = src_[pos_ - 1] == '\n';
          return;
        }
        if (!block && (starts_with(src_, pos_, "-}}") || starts_with(src_, pos_, "}}"))) {
          push(Tok::VarEnd, "}}", pos_);
          pos_ = src_[pos_] == '-' ? skip_space(src_, pos_ + 3) : pos_ + 2;
          line_starting_ = src_[pos_ - 1] == '\n';
          return;
        }
      }
      size_t len = 0;
      if (space_at(src_, pos_, &len)) {
        pos_ = skip_space(src_, pos_);
        continue;
      }
      if (lex_number()) continue;
      const char c = src_[pos_];
      if (is_name_start(c)) {
        size_t e = pos_;
        while (e < n && is_name_char(src_[e])) ++e;
        push(Tok::Name, src_.substr(pos_, e - pos_), pos_);
        pos_ = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        lex_string();
        continue;
      }
      static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                         "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
      const char* op = nullptr;
      for (const char* candidate : kOps)
        if (starts_with(src_, pos_, candidate)) {
          op = candidate;
          break;
        }
      if (!op) fail(pos_, std::string("unexpected char '") + c + "'");
      const std::string o(op);
      if (o == "{" || o == "(" || o == "[") {
        balance.push_back(o == "{" ? '}' : o == "(" ? ')' : ']');
      } else if (o == "}" || o == ")" || o == "]") {
        if (balance.empty()) fail(pos_, "unexpected '" + o + "'");
        if (balance.back() != o[0]) fail(pos_, "unexpected '" + o + "', expected '" + balance.back() + "'");
        balance.pop_back();
      }
      push(Tok::Op, o, pos_);
      pos_ += o.size();
    }
  }

  bool lex_number() {
    const size_t n = src_.size();
    const size_t start = pos_;
    if (start >= n || !is_digit(src_[start])) return false;
    // float: (\d+_)*\d+ ((\.(\d+_)*\d+)? e[+-]?(\d+_)*\d+ | \.(\d+_)*\d+), not right after a '.'
    if (start == 0 || src_[start - 1] != '.') {
      const size_t int_end = match_digits(src_, start);
      size_t frac_end = std::string::npos;
      if (int_end < n && src_[int_end] == '.') frac_end = match_digits(src_, int_end + 1);
      size_t p = frac_end != std::string::npos ? frac_end : int_end;
      size_t exp_end = std::string::npos;
      if (p < n && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t q = p + 1;
        if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
        exp_end = match_digits(src_, q);
      }
      const size_t end = exp_end != std::string::npos ? exp_end : frac_end;
      if (end != std::string::npos) {
        std::string text = src_.substr(start, end - start);
        text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
        push(Tok::Float, text, start);
        out_.back().float_value = std::strtod(text.c_str(), nullptr);
        pos_ = end;
        return true;
      }
    }
    // integer: 0b.., 0o.., 0x.., [1-9](_?\d)*, 0(_?0)*
    int base = 10;
    size_t p = start;
    auto digit_ok = [&](char ch) {
      const char l = static_cast<char>(ch | 0x20);
      if (base == 2) return ch == '0' || ch == '1';
      if (base == 8) return ch >= '0' && ch <= '7';
      if (base == 16) return is_digit(ch) || (l >= 'a' && l <= 'f');
      return is_digit(ch);
    };
    std::string digits;
    if (src_[p] == '0' && p + 1 < n && std::strchr("bBoOxX", src_[p + 1]) && src_[p + 1] != 0) {
      const char l = static_cast<char>(src_[p + 1] | 0x20);
      base = l == 'b' ? 2 : l == 'o' ? 8 : 16;
      size_t q = p + 2;
      while (q < n) {
        if (src_[q] == '_' && q + 1 < n && digit_ok(src_[q + 1])) ++q;
        if (q < n && digit_ok(src_[q])) digits.push_back(src_[q++]);
        else break;
      }
      if (!digits.empty()) p = q;
      else base = 10;
    }
    if (base == 10) {
      const bool zero = src_[p] == '0';
      digits.push_back(src_[p++]);
      while (p < n) {
        const size_t q = (src_[p] == '_' && p + 1 < n) ? p + 1 : p;
        if (is_digit(src_[q]) && (!zero || src_[q] == '0')) {
          digits.push_back(src_[q]);
          p = q + 1;
        } else {
          break;
        }
      }
    }
    push(Tok::Int, src_.substr(start, p - start), start);
    try {
      out_.back().int_value = std::stoll(digits, nullptr, base);
    } catch (const std::exception&) {
      fail(start, "integer literal out of range: " + src_.substr(start, p - start));
    }
    pos_ = p;
    return true;
  }

  // A string literal with Python's escapes (jinja2 decodes them with "unicode-escape").
  void lex_string() {
    const size_t start = pos_;
    const char quote = src_[start];
    size_t p = start + 1;
    const size_t n = src_.size();
    while (p < n && src_[p] != quote) p += src_[p] == '\\' ? 2 : 1;
    if (p >= n) fail(start, std::string("unexpected char '") + quote + "' (unterminated string)");
    std::string value;
    auto hex = [&](size_t at, size_t count) {
      if (at + count > p) fail(start, "truncated escape in string literal");
      char32_t cp = 0;
      for (size_t k = 0; k < count; ++k) {
        const char ch = src_[at + k];
        const char l = static_cast<char>(ch | 0x20);
        int d = is_digit(ch) ? ch - '0' : (l >= 'a' && l <= 'f') ? l - 'a' + 10 : -1;
        if (d < 0) fail(start, "truncated escape in string literal");
        cp = cp * 16 + static_cast<char32_t>(d);
      }
      return cp;
    };
    for (size_t k = start + 1; k < p; ++k) {
      if (src_[k] != '\\') {
        value.push_back(src_[k]);
        continue;
      }
      const char e = src_[++k];
      switch (e) {
        case '\n': break;
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case 'a': value.push_back('\a'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'n': value.push_back('\n'); break;
        case 'r': value.push_back('\r'); break;
        case 't': value.push_back('\t'); break;
        case 'v': value.push_back('\v'); break;
        case 'x': utf8_append(value, hex(k + 1, 2)); k += 2; break;
        case 'u': utf8_append(value, hex(k + 1, 4)); k += 4; break;
        case 'U': utf8_append(value, hex(k + 1, 8)); k += 8; break;
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = 0;
            size_t count = 0;
            while (count < 3 && k < p && src_[k] >= '0' && src_[k] <= '7') {
              cp = cp * 8 + static_cast<char32_t>(src_[k++] - '0');
              ++count;
            }
            --k;
            utf8_append(value, cp);
          } else {
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    push(Tok::String, std::move(value), start);
    pos_ = p + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

// jinja2: "\r\n", "\r" and "\n" all become "\n"; a final line break is dropped.
std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      out.push_back('\n');
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      out.push_back(source[k]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> lex_template(const std::string& source) { return Lexer(normalize_newlines(source)).run(); }

}  // namespace mt::serve::chat_template_detail
