#include "meshtrain/train/porter_stemmer.h"

#include <initializer_list>
#include <utility>

namespace mt::train {

namespace {

// The word being stemmed and the paper's predicates over its prefix w[0, k).
class Stemmer {
 public:
  explicit Stemmer(std::string_view w) : w_(w) {}
  std::string run() {
    if (w_.size() <= 2) return w_;
    step1a(), step1b(), step1c(), step2(), step3(), step4(), step5a(), step5b();
    return w_;
  }

 private:
  // A consonant is a letter other than a, e, i, o, u, and other than y preceded by a consonant.
  bool consonant(size_t i) const {
    switch (w_[i]) {
      case 'a': case 'e': case 'i': case 'o': case 'u': return false;
      case 'y': return i == 0 || !consonant(i - 1);
      default: return true;
    }
  }
  // m: the number of VC sequences in w[0, k) ([C](VC)^m[V]).
  int measure(size_t k) const {
    size_t i = 0;
    while (i < k && consonant(i)) ++i;
    int m = 0;
    while (i < k) {
      while (i < k && !consonant(i)) ++i;
      if (i >= k) break;
      while (i < k && consonant(i)) ++i;
      ++m;
    }
    return m;
  }
  bool has_vowel(size_t k) const {
    for (size_t i = 0; i < k; ++i)
      if (!consonant(i)) return true;
    return false;
  }
  bool double_consonant(size_t k) const { return k >= 2 && w_[k - 1] == w_[k - 2] && consonant(k - 1); }
  // *o: w[0, k) ends consonant-vowel-consonant, the last not w, x or y.
  bool cvc(size_t k) const {
    if (k < 3 || !consonant(k - 1) || consonant(k - 2) || !consonant(k - 3)) return false;
    const char c = w_[k - 1];
    return c != 'w' && c != 'x' && c != 'y';
  }
  bool ends(std::string_view s) const { return w_.size() >= s.size() && std::string_view(w_).substr(w_.size() - s.size()) == s; }
  size_t stem_len(std::string_view suffix) const { return w_.size() - suffix.size(); }
  void replace(std::string_view suffix, std::string_view by) { w_ = w_.substr(0, stem_len(suffix)) + std::string(by); }
  // The first rule whose suffix ends the word decides: replaced when the stem's measure exceeds min_m.
  void rules(std::initializer_list<std::pair<std::string_view, std::string_view>> table, int min_m) {
    for (const auto& [suffix, by] : table)
      if (ends(suffix)) {
        if (measure(stem_len(suffix)) > min_m) replace(suffix, by);
        return;
      }
  }

  void step1a() {
    if (ends("sses")) replace("sses", "ss");
    else if (ends("ies")) replace("ies", "i");
    else if (ends("ss")) return;
    else if (ends("s")) replace("s", "");
  }
  void step1b() {
    bool tidy = false;
    if (ends("eed")) {
      if (measure(stem_len("eed")) > 0) replace("eed", "ee");
    } else if (ends("ed") && has_vowel(stem_len("ed"))) {
      replace("ed", ""), tidy = true;
    } else if (ends("ing") && has_vowel(stem_len("ing"))) {
      replace("ing", ""), tidy = true;
    }
    if (!tidy) return;
    if (ends("at") || ends("bl") || ends("iz")) {
      w_ += 'e';
    } else if (double_consonant(w_.size())) {
      const char c = w_.back();
      if (c != 'l' && c != 's' && c != 'z') w_.pop_back();
    } else if (measure(w_.size()) == 1 && cvc(w_.size())) {
      w_ += 'e';
    }
  }
  void step1c() {
    if (ends("y") && has_vowel(w_.size() - 1)) w_.back() = 'i';
  }
  void step2() {
    rules({{"ational", "ate"}, {"tional", "tion"}, {"enci", "ence"}, {"anci", "ance"}, {"izer", "ize"},
           {"abli", "able"}, {"alli", "al"}, {"entli", "ent"}, {"eli", "e"}, {"ousli", "ous"},
           {"ization", "ize"}, {"ation", "ate"}, {"ator", "ate"}, {"alism", "al"}, {"iveness", "ive"},
           {"fulness", "ful"}, {"ousness", "ous"}, {"aliti", "al"}, {"iviti", "ive"}, {"biliti", "ble"}},
          0);
  }
  void step3() {
    rules({{"icate", "ic"}, {"ative", ""}, {"alize", "al"}, {"iciti", "ic"}, {"ical", "ic"}, {"ful", ""},
           {"ness", ""}},
          0);
  }
  void step4() {
    for (std::string_view s : {"al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion",
                               "ou", "ism", "ate", "iti", "ous", "ive", "ize"}) {
      if (!ends(s)) continue;
      // Longest match first among suffixes sharing an ending: ement before ment before ent.
      if (s == "ment" && ends("ement")) continue;
      if (s == "ent" && (ends("ement") || ends("ment"))) continue;
      const size_t k = stem_len(s);
      if (measure(k) <= 1) return;
      if (s == "ion" && !(k > 0 && (w_[k - 1] == 's' || w_[k - 1] == 't'))) return;
      w_.resize(k);
      return;
    }
  }
  void step5a() {
    if (!ends("e")) return;
    const size_t k = w_.size() - 1;
    const int m = measure(k);
    if (m > 1 || (m == 1 && !cvc(k))) w_.pop_back();
  }
  void step5b() {
    if (measure(w_.size()) > 1 && double_consonant(w_.size()) && w_.back() == 'l') w_.pop_back();
  }

  std::string w_;
};

}  // namespace

std::string porter_stem(std::string_view word) { return Stemmer(word).run(); }

}  // namespace mt::train
