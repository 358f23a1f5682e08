#include "meshtrain/train/porter_stemmer.h"

#include <initializer_list>

namespace mt::train {

namespace {

// Which rule set: the 1980 paper's, or NLTK's default (the one rouge-score stems with).
enum class Variant { kOriginal, kNltk };

// Words NLTK stems by lookup before any rule runs: the rules would mangle them ("skies" ->
// "ski", "dying" -> "dy") or strip a suffix that is part of the word ("news", "innings").
struct Irregular {
  std::string_view word, stem;
};
constexpr Irregular kIrregular[] = {
    {"sky", "sky"},         {"skies", "sky"},      {"dying", "die"},      {"lying", "lie"},
    {"tying", "tie"},       {"news", "news"},      {"innings", "inning"}, {"inning", "inning"},
    {"outings", "outing"},  {"outing", "outing"},  {"cannings", "canning"}, {"canning", "canning"},
    {"howe", "howe"},       {"proceed", "proceed"}, {"exceed", "exceed"}, {"succeed", "succeed"},
};

// One suffix rule of steps 2 and 3: `suffix` -> `by` when the measure of what precedes the
// suffix, plus its first `counted` letters, is positive. `counted` is 0 except for NLTK's
// "logi" rule, which measures the stem with its "l".
struct Rule {
  std::string_view suffix, by;
  size_t counted = 0;
};

// The word being stemmed and the paper's predicates over its prefix w[0, k).
class Stemmer {
 public:
  Stemmer(std::string_view w, Variant v) : w_(w), nltk_(v == Variant::kNltk) {}
  std::string run() {
    if (nltk_)
      for (const Irregular& x : kIrregular)
        if (x.word == w_) return std::string(x.stem);
    if (w_.size() <= 2) return w_;
    step1a(), step1b(), step1c(), step2(), step3(), step4(), step5a(), step5b();
    return w_;
  }

 private:
  // A consonant is a letter other than a, e, i, o, u, and other than y preceded by a consonant
  // (a leading y is a consonant). Digits count as consonants, as in NLTK.
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
  // *o: w[0, k) ends consonant-vowel-consonant, the last not w, x or y. NLTK also accepts a
  // stem of exactly two letters, vowel then consonant (any consonant, w/x/y included), so that
  // "using" -> "use" and "use" keeps its e.
  bool cvc(size_t k) const {
    if (nltk_ && k == 2) return !consonant(0) && consonant(1);
    if (k < 3 || !consonant(k - 1) || consonant(k - 2) || !consonant(k - 3)) return false;
    const char c = w_[k - 1];
    return c != 'w' && c != 'x' && c != 'y';
  }
  bool ends(std::string_view s) const { return w_.size() >= s.size() && std::string_view(w_).substr(w_.size() - s.size()) == s; }
  size_t stem_len(std::string_view suffix) const { return w_.size() - suffix.size(); }
  void replace(std::string_view suffix, std::string_view by) { w_ = w_.substr(0, stem_len(suffix)) + std::string(by); }
  // The first rule whose suffix ends the word decides, whether or not its condition holds
  // (a failed condition leaves the word as it is; later rules are not tried). True when one
  // decided.
  bool rules(std::initializer_list<Rule> table) {
    for (const Rule& r : table)
      if (ends(r.suffix)) {
        if (measure(stem_len(r.suffix) + r.counted) > 0) replace(r.suffix, r.by);
        return true;
      }
    return false;
  }

  void step1a() {
    // NLTK: a four-letter "-ies" word is a plural of a three-letter "-ie" word ("ties", "pies").
    if (nltk_ && w_.size() == 4 && ends("ies")) replace("ies", "ie");
    else if (ends("sses")) replace("sses", "ss");
    else if (ends("ies")) replace("ies", "i");
    else if (ends("ss")) return;
    else if (ends("s")) replace("s", "");
  }
  void step1b() {
    // NLTK: "-ied" is settled here and now, unconditionally: "tied" -> "tie" (four letters, as
    // in step 1a), otherwise "-i" ("cried" -> "cri", which step 1c's "cry" -> "cri" meets).
    if (nltk_ && ends("ied")) {
      replace("ied", w_.size() == 4 ? "ie" : "i");
      return;
    }
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
    if (!ends("y")) return;
    const size_t k = w_.size() - 1;
    // The paper turns y into i after any vowel in the stem ("enjoy" -> "enjoi"); NLTK only
    // after a consonant that is not the stem's only letter ("happy" -> "happi", "enjoy" and
    // "by" unchanged, "fly" -> "fli" to meet "flies" -> "fli").
    const bool to_i = nltk_ ? k > 1 && consonant(k - 1) : has_vowel(k);
    if (to_i) w_.back() = 'i';
  }
  void step2() {
    // NLTK: "-alli" -> "-al" and step 2 runs again on the result, so a suffix before it can
    // go too ("conditionalli" -> "conditional" -> "condition"). The result ends in "al", so
    // the second pass is one pass of the table below.
    if (nltk_ && ends("alli") && measure(stem_len("alli")) > 0) replace("alli", "al");
    // NLTK widens the paper's "abli" -> "able" to "bli" -> "ble" ("possibli" -> "possible") and
    // adds "fulli" -> "ful" and "logi" -> "log" after the paper's rules.
    if (rules({{"ational", "ate"}, {"tional", "tion"}, {"enci", "ence"}, {"anci", "ance"}, {"izer", "ize"},
               nltk_ ? Rule{"bli", "ble"} : Rule{"abli", "able"}, {"alli", "al"}, {"entli", "ent"}, {"eli", "e"},
               {"ousli", "ous"}, {"ization", "ize"}, {"ation", "ate"}, {"ator", "ate"}, {"alism", "al"},
               {"iveness", "ive"}, {"fulness", "ful"}, {"ousness", "ous"}, {"aliti", "al"}, {"iviti", "ive"},
               {"biliti", "ble"}}))
      return;
    if (nltk_) rules({{"fulli", "ful"}, {"logi", "log", 1}});
  }
  void step3() {
    rules({{"icate", "ic"}, {"ative", ""}, {"alize", "al"}, {"iciti", "ic"}, {"ical", "ic"}, {"ful", ""},
           {"ness", ""}});
  }
  void step4() {
    // The first suffix that ends the word decides; of the nested ones, the longest is listed
    // first (ement, ment, ent).
    for (std::string_view s : {"al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion",
                               "ou", "ism", "ate", "iti", "ous", "ive", "ize"}) {
      if (!ends(s)) continue;
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
  bool nltk_;
};

}  // namespace

std::string porter_stem(std::string_view word) { return Stemmer(word, Variant::kNltk).run(); }

std::string porter_stem_original(std::string_view word) { return Stemmer(word, Variant::kOriginal).run(); }

}  // namespace mt::train
