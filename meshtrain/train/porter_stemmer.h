#pragma once
// The Porter stemmer as ROUGE's optional stemming applies it to lower-case alphanumeric tokens.
//
// porter_stem follows NLTK's PorterStemmer() in its default mode (NLTK_EXTENSIONS), not the
// 1980 paper: Google's rouge-score package, whose scores rouge.cpp reproduces, stems with
// nltk.stem.porter.PorterStemmer(), so any other variant would shift ROUGE values. That mode
// departs from the paper in a few places: a pool of irregular words stemmed by lookup
// ("skies" -> "sky", "dying" -> "die", "news" -> "news", "proceed" -> "proceed"), four-letter
// "-ies"/"-ied" words keep their "ie" ("ties" -> "tie"), other "-ied" -> "i" at once, "-y" -> "i"
// only after a consonant that is not the whole stem ("enjoy" stays, "fly" -> "fli"), step 2's
// "bli" (not "abli") -> "ble", an "alli" that reruns step 2 ("conditionalli" -> "condit"), the
// extra "fulli" -> "ful" and "logi" -> "log" rules, and a two-letter vowel-consonant stem
// counting as *o in steps 1b and 5a ("using" -> "use"). tests/unit/rouge_test.cpp compares it
// word by word with NLTK itself.
//
// porter_stem_original is the algorithm as published (M. F. Porter, "An algorithm for suffix
// stripping", 1980: "caresses" -> "caress", "ties" -> "ti", "relational" -> "relat").
#include <string>
#include <string_view>

namespace mt::train {

// The stem NLTK's default PorterStemmer gives a lower-case ASCII word (letters and digits);
// words of one or two characters are returned unchanged.
std::string porter_stem(std::string_view word);

// The stem by the 1980 paper's rules alone; words of one or two characters are returned unchanged.
std::string porter_stem_original(std::string_view word);

}  // namespace mt::train
