#include "meshtrain/train/bleu.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "meshtrain/core/error.h"

namespace mt::train {

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// mteval's punctuation: { | } ~  [ \ ] ^ _ `  space ! " # $ % &  ( ) * +  : ; < = > ? @  /
bool is_13a_symbol(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return (u >= '{' && u <= '~') || (u >= '[' && u <= '`') || (u >= ' ' && u <= '&') || (u >= '(' && u <= '+') ||
         (u >= ':' && u <= '@') || u == '/';
}

// One left-to-right pass of a two-character pattern (first, second) replaced by
// `before` first `between` second `after`, matches not overlapping: Python's re.sub on these
// patterns. Bytes stand for characters: the classes only test ASCII, and a multi-byte
// character's bytes never match the ASCII ones.
template <class First, class Second>
std::string sub_pairs(const std::string& s, First first, Second second, const char* before, const char* between,
                      const char* after) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t i = 0;
  while (i < s.size()) {
    if (i + 1 < s.size() && first(s[i]) && second(s[i + 1])) {
      out += before;
      out += s[i];
      out += between;
      out += s[i + 1];
      out += after;
      i += 2;
    } else {
      out += s[i++];
    }
  }
  return out;
}

std::vector<std::string> split_ws(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  while (i < s.size()) {
    while (i < s.size() && ws(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !ws(s[j])) ++j;
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::vector<std::string> tokens_13a(std::string_view line) {
  // sacrebleu strips trailing whitespace before tokenizing.
  size_t end = line.size();
  while (end > 0 && std::string(" \t\n\r\v\f").find(line[end - 1]) != std::string::npos) --end;
  return split_ws(tokenize_13a(line.substr(0, end)));
}

using Counts = std::map<std::vector<std::string>, int64_t>;

Counts ngrams(const std::vector<std::string>& t, int n) {
  Counts c;
  for (size_t i = 0; i + size_t(n) <= t.size(); ++i) ++c[std::vector<std::string>(t.begin() + i, t.begin() + i + n)];
  return c;
}

}  // namespace

std::string tokenize_13a(std::string_view text) {
  std::string line(text);
  replace_all(line, "<skipped>", "");
  replace_all(line, "-\n", "");
  replace_all(line, "\n", " ");
  if (line.find('&') != std::string::npos) {
    replace_all(line, "&quot;", "\"");
    replace_all(line, "&amp;", "&");
    replace_all(line, "&lt;", "<");
    replace_all(line, "&gt;", ">");
  }
  line = " " + line + " ";
  std::string spaced;
  for (char c : line) {
    if (is_13a_symbol(c)) {
      spaced += ' ';
      spaced += c;
      spaced += ' ';
    } else {
      spaced += c;
    }
  }
  auto period_comma = [](char c) { return c == '.' || c == ','; };
  auto non_digit = [](char c) { return !is_digit(c); };
  spaced = sub_pairs(spaced, non_digit, period_comma, "", " ", " ");  // ([^0-9])([\.,]) -> \1 \2_
  spaced = sub_pairs(spaced, period_comma, non_digit, " ", " ", "");  // ([\.,])([^0-9]) -> _\1 \2
  spaced = sub_pairs(spaced, is_digit, [](char c) { return c == '-'; }, "", " ", " ");  // ([0-9])(-) -> \1 \2_
  const std::vector<std::string> words = split_ws(spaced);
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) out += (i ? " " : "") + words[i];
  return out;
}

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses, const std::vector<std::vector<std::string>>& references) {
  MT_CHECK(hypotheses.size() == references.size(), "[bleu] ", hypotheses.size(), " hypotheses but ", references.size(),
           " reference lists");
  std::array<int64_t, 4> correct{}, total{};
  BleuScore s;
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    const std::vector<std::string> hyp = tokens_13a(hypotheses[i]);
    std::vector<std::vector<std::string>> refs;
    for (const std::string& r : references[i])
      if (!r.empty()) refs.push_back(tokens_13a(r));
    MT_CHECK(!refs.empty(), "[bleu] hypothesis ", i, " has no non-empty reference");
    const int64_t hyp_len = int64_t(hyp.size());
    int64_t closest_diff = -1, closest_len = -1;
    for (const auto& r : refs) {
      const int64_t len = int64_t(r.size()), diff = std::abs(hyp_len - len);
      if (closest_diff == -1 || diff < closest_diff) closest_diff = diff, closest_len = len;
      else if (diff == closest_diff && len < closest_len) closest_len = len;
    }
    s.hypothesis_length += hyp_len;
    s.reference_length += closest_len;
    for (int n = 1; n <= 4; ++n) {
      Counts most;
      for (const auto& r : refs)
        for (const auto& [g, c] : ngrams(r, n)) most[g] = std::max(most[g], c);
      for (const auto& [g, c] : ngrams(hyp, n)) {
        auto it = most.find(g);
        if (it != most.end()) correct[size_t(n - 1)] += std::min(c, it->second);
      }
      total[size_t(n - 1)] += std::max<int64_t>(hyp_len - n + 1, 0);
    }
  }
  const double sys = double(s.hypothesis_length), ref = double(s.reference_length);
  s.brevity_penalty = sys < ref ? (sys > 0 ? std::exp(1.0 - ref / sys) : 0.0) : 1.0;
  if (total[0] == 0) return s;
  double smooth = 1.0, log_sum = 0.0;
  for (int n = 0; n < 4; ++n) {
    if (total[size_t(n)] == 0) break;  // no n-grams of this order: precision stays 0
    if (correct[size_t(n)] == 0) {
      smooth *= 2;  // sacrebleu's "exp": 1 / 2^k for the k-th order without a match
      s.precisions[size_t(n)] = 100.0 / (smooth * double(total[size_t(n)]));
    } else {
      s.precisions[size_t(n)] = 100.0 * double(correct[size_t(n)]) / double(total[size_t(n)]);
    }
  }
  for (double p : s.precisions) log_sum += p == 0.0 ? -9999999999.0 : std::log(p);
  s.score = s.brevity_penalty * std::exp(log_sum / 4.0);
  return s;
}

}  // namespace mt::train
