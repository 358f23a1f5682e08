#include "meshtrain/train/rouge.h"

#include <algorithm>
#include <map>
#include <set>

#include "meshtrain/core/error.h"
#include "meshtrain/train/porter_stemmer.h"

namespace mt::train {

namespace {

RougeScore score(double hits, double prediction_total, double target_total) {
  RougeScore s;
  s.precision = prediction_total > 0 ? hits / prediction_total : 0;
  s.recall = target_total > 0 ? hits / target_total : 0;
  s.fmeasure = s.precision + s.recall > 0 ? 2 * s.precision * s.recall / (s.precision + s.recall) : 0;
  return s;
}

// (|a| + 1) x (|b| + 1) table of LCS lengths of prefixes.
std::vector<std::vector<int>> lcs_table(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<std::vector<int>> t(a.size() + 1, std::vector<int>(b.size() + 1, 0));
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j)
      t[i][j] = a[i - 1] == b[j - 1] ? t[i - 1][j - 1] + 1 : std::max(t[i - 1][j], t[i][j - 1]);
  return t;
}

// Indices into `ref` of one LCS with `can`, backtracked as rouge-score does (prefer moving
// along `can` when that keeps a strictly longer LCS).
std::vector<size_t> lcs_indices(const std::vector<std::string>& ref, const std::vector<std::string>& can) {
  const auto t = lcs_table(ref, can);
  std::vector<size_t> out;
  size_t i = ref.size(), j = can.size();
  while (i > 0 && j > 0) {
    if (ref[i - 1] == can[j - 1]) {
      out.push_back(i - 1), --i, --j;
    } else if (t[i][j - 1] > t[i - 1][j]) {
      --j;
    } else {
      --i;
    }
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::vector<std::string>> sentences(std::string_view text, bool use_stemmer) {
  std::vector<std::vector<std::string>> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    if (end > start) out.push_back(rouge_tokenize(text.substr(start, end - start), use_stemmer));
    start = end + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> rouge_tokenize(std::string_view text, bool use_stemmer) {
  std::vector<std::string> tokens;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    tokens.push_back(use_stemmer && cur.size() > 3 ? porter_stem(cur) : cur);
    cur.clear();
  };
  for (char ch : text) {
    const unsigned char u = static_cast<unsigned char>(ch);
    const char c = u < 128 && u >= 'A' && u <= 'Z' ? char(u - 'A' + 'a') : ch;
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) cur += c;
    else flush();  // any other byte (punctuation, space, non-ASCII) separates tokens
  }
  flush();
  return tokens;
}

RougeScore rouge_n(const std::vector<std::string>& target, const std::vector<std::string>& prediction, int n) {
  MT_CHECK(n >= 1, "[rouge] n must be >= 1, got ", n);
  auto grams = [n](const std::vector<std::string>& t) {
    std::map<std::vector<std::string>, int> counts;
    for (size_t i = 0; i + size_t(n) <= t.size(); ++i) ++counts[std::vector<std::string>(t.begin() + long(i), t.begin() + long(i) + n)];
    return counts;
  };
  const auto tg = grams(target), pg = grams(prediction);
  double hits = 0, tt = 0, pt = 0;
  for (const auto& [g, c] : tg) {
    tt += c;
    auto it = pg.find(g);
    if (it != pg.end()) hits += std::min(c, it->second);
  }
  for (const auto& [g, c] : pg) pt += c;
  return score(hits, pt, tt);
}

RougeScore rouge_l(const std::vector<std::string>& target, const std::vector<std::string>& prediction) {
  if (target.empty() || prediction.empty()) return {};
  const double lcs = lcs_table(target, prediction)[target.size()][prediction.size()];
  return score(lcs, double(prediction.size()), double(target.size()));
}

RougeScore rouge_lsum(std::string_view target, std::string_view prediction, bool use_stemmer) {
  const auto ref = sentences(target, use_stemmer), can = sentences(prediction, use_stemmer);
  std::map<std::string, int> ref_left, can_left;
  double m = 0, n = 0;
  for (const auto& s : ref)
    for (const auto& t : s) ++ref_left[t], ++m;
  for (const auto& s : can)
    for (const auto& t : s) ++can_left[t], ++n;
  if (m == 0 || n == 0) return {};
  double hits = 0;
  for (const auto& r : ref) {
    // The union of r's tokens in an LCS with any candidate sentence, in r's order.
    std::set<size_t> uni;
    for (const auto& c : can)
      for (size_t i : lcs_indices(r, c)) uni.insert(i);
    for (size_t i : uni) {
      const std::string& t = r[i];
      if (can_left[t] > 0 && ref_left[t] > 0) ++hits, --can_left[t], --ref_left[t];
    }
  }
  return score(hits, n, m);
}

RougeScores rouge(std::string_view target, std::string_view prediction, bool use_stemmer) {
  const auto t = rouge_tokenize(target, use_stemmer), p = rouge_tokenize(prediction, use_stemmer);
  return {rouge_n(t, p, 1), rouge_n(t, p, 2), rouge_l(t, p), rouge_lsum(target, prediction, use_stemmer)};
}

RougeScores mean_rouge(const std::vector<std::string>& targets, const std::vector<std::string>& predictions,
                       bool use_stemmer) {
  MT_CHECK(targets.size() == predictions.size(), "[rouge] ", targets.size(), " targets but ", predictions.size(),
           " predictions");
  RougeScores sum;
  auto add = [](RougeScore& a, const RougeScore& b) {
    a.precision += b.precision, a.recall += b.recall, a.fmeasure += b.fmeasure;
  };
  for (size_t i = 0; i < targets.size(); ++i) {
    const RougeScores s = rouge(targets[i], predictions[i], use_stemmer);
    add(sum.rouge1, s.rouge1), add(sum.rouge2, s.rouge2), add(sum.rougeL, s.rougeL), add(sum.rougeLsum, s.rougeLsum);
  }
  if (targets.empty()) return sum;
  const double k = double(targets.size());
  for (RougeScore* s : {&sum.rouge1, &sum.rouge2, &sum.rougeL, &sum.rougeLsum})
    s->precision /= k, s->recall /= k, s->fmeasure /= k;
  return sum;
}

}  // namespace mt::train
