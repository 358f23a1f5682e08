// ROUGE against values computed by hand and rouge-score's published README example; the
// Porter stemmer against the examples of Porter's 1980 paper (porter_stem_original) and, word
// by word, against NLTK's PorterStemmer() (porter_stem, the stemmer rouge-score calls) on every
// token of Tiny Shakespeare and SST-2 in ../shared/data. NLTK is /usr/bin/python3's
// python3-nltk (scripts/install-deps.sh); without it that test fails, it does not skip.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/train/porter_stemmer.h"
#include "meshtrain/train/rouge.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

using namespace mt::train;

TEST(PorterStemmer, ThePapersExamples) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"caresses", "caress"}, {"ponies", "poni"}, {"ties", "ti"}, {"caress", "caress"}, {"cats", "cat"},
      {"feed", "feed"}, {"agreed", "agre"}, {"plastered", "plaster"}, {"bled", "bled"}, {"motoring", "motor"},
      {"sing", "sing"}, {"conflated", "conflat"}, {"troubled", "troubl"}, {"sized", "size"}, {"hopping", "hop"},
      {"tanned", "tan"}, {"falling", "fall"}, {"hissing", "hiss"}, {"fizzed", "fizz"}, {"failing", "fail"},
      {"filing", "file"}, {"happy", "happi"}, {"sky", "sky"}, {"relational", "relat"}, {"conditional", "condit"},
      {"rational", "ration"}, {"valenci", "valenc"}, {"hesitanci", "hesit"}, {"digitizer", "digit"},
      {"conformabli", "conform"}, {"radicalli", "radic"}, {"differentli", "differ"}, {"vileli", "vile"},
      {"analogousli", "analog"}, {"vietnamization", "vietnam"}, {"predication", "predic"}, {"operator", "oper"},
      {"feudalism", "feudal"}, {"decisiveness", "decis"}, {"hopefulness", "hope"}, {"callousness", "callous"},
      {"formaliti", "formal"}, {"sensitiviti", "sensit"}, {"sensibiliti", "sensibl"}, {"triplicate", "triplic"},
      {"formative", "form"}, {"formalize", "formal"}, {"electriciti", "electr"}, {"electrical", "electr"},
      {"hopeful", "hope"}, {"goodness", "good"}, {"revival", "reviv"}, {"allowance", "allow"},
      {"inference", "infer"}, {"airliner", "airlin"}, {"gyroscopic", "gyroscop"}, {"adjustable", "adjust"},
      {"defensible", "defens"}, {"irritant", "irrit"}, {"replacement", "replac"}, {"adjustment", "adjust"},
      {"dependent", "depend"}, {"adoption", "adopt"}, {"homologou", "homolog"}, {"communism", "commun"},
      {"activate", "activ"}, {"angulariti", "angular"}, {"homologous", "homolog"}, {"effective", "effect"},
      {"bowdlerize", "bowdler"}, {"probate", "probat"}, {"rate", "rate"}, {"cease", "ceas"},
      {"controlling", "control"}, {"roll", "roll"}, {"generalizations", "gener"}, {"oscillators", "oscil"}};
  for (const auto& [word, stem] : cases) {
    EXPECT_EQ(porter_stem_original(word), stem) << word;
    // NLTK's default mode (porter_stem) agrees on all of them but one: a four-letter "-ies"
    // word keeps its "ie" there (NLTK 3.8 gives "tie").
    EXPECT_EQ(porter_stem(word), std::string_view(word) == "ties" ? "tie" : stem) << word;
  }
}

constexpr const char* kPython = "/usr/bin/python3";
const std::string kData = std::string(MT_DATA_DIR);

// Stems each line of the file argv[1] with NLTK's PorterStemmer() (default mode, as rouge-score
// builds it), one stem a line; exits 3 with a line saying why when nltk cannot be imported.
// No single quotes: the script travels inside '...' on the shell line.
constexpr const char* kNltkStem = R"(
import sys
try:
    from nltk.stem.porter import PorterStemmer
except ImportError as e:
    print("cannot import nltk:", e)
    sys.exit(3)
stemmer = PorterStemmer()
with open(sys.argv[1]) as f:
    for word in f.read().splitlines():
        print(stemmer.stem(word))
)";

// Runs `command` (stderr folded into stdout): exit code and output.
std::pair<int, std::string> run_command(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every distinct token, as rouge-score's tokenizer cuts them (lower case, split on
// non-[a-z0-9]), of Tiny Shakespeare and of the sentence column of SST-2's three files.
std::set<std::string> corpus_words() {
  std::set<std::string> words;
  const std::string shakespeare = read_file(kData + "/text/tinyshakespeare.txt");
  EXPECT_FALSE(shakespeare.empty()) << kData << "/text/tinyshakespeare.txt is missing";
  for (std::string& t : rouge_tokenize(shakespeare, false)) words.insert(std::move(t));
  for (const char* split : {"train", "dev", "test"}) {
    std::ifstream in(kData + "/glue/SST-2/" + split + ".tsv");
    EXPECT_TRUE(in.good()) << kData << "/glue/SST-2/" << split << ".tsv is missing";
    std::string line;
    size_t column = 0;  // the header names the columns: "sentence\tlabel" or "index\tsentence"
    for (bool header = true; std::getline(in, line); header = false) {
      std::vector<std::string> fields;
      std::istringstream cells(line);
      for (std::string f; std::getline(cells, f, '\t');) fields.push_back(f);
      if (header) {
        while (column < fields.size() && fields[column] != "sentence") ++column;
        EXPECT_LT(column, fields.size()) << split << ".tsv has no sentence column";
      } else if (column < fields.size()) {
        for (std::string& t : rouge_tokenize(fields[column], false)) words.insert(std::move(t));
      }
    }
  }
  return words;
}

TEST(PorterStemmer, IdenticalToNltksDefaultMode) {
  std::set<std::string> words = corpus_words();
  EXPECT_GT(words.size(), 20000u) << "the corpora of " << kData << " gave too few words";
  // Words each of NLTK's departures from the paper decides, whether or not the corpora hold them.
  for (const char* w :
       {// the irregular pool, and neighbours the rules stem
        "sky", "skies", "dying", "lying", "tying", "news", "innings", "inning", "outings", "outing", "cannings",
        "canning", "howe", "proceed", "exceed", "succeed", "proceeding", "exceeds", "succeeded", "newsy",
        // four-letter "-ies"/"-ied", other "-ied"
        "ties", "dies", "lies", "pies", "tied", "died", "lied", "cried", "spied", "flies", "ied", "ies",
        // step 1c: y -> i only after a consonant that is not the whole stem
        "fly", "spy", "try", "by", "enjoy", "enjoyed", "toy", "happy", "syzygy", "yyyy", "say", "y2k",
        // step 2: bli, alli rerun, fulli, logi
        "possibly", "possibli", "conformabli", "conditionalli", "radicalli", "rationalli", "generously", "fully",
        "hopefully", "carefulli", "analogi", "biologi", "geologi", "apologi", "logi", "ologi",
        // the two-letter *o in steps 1b and 5a
        "using", "owing", "axing", "use", "uses", "eyes", "aged", "ageing", "oxen", "eing",
        // short and odd words
        "a", "s", "is", "as", "eed", "ing", "feed", "agreed", "1990s", "2nd", "ownership", "identifying"})
    words.insert(w);

  char path[] = "/tmp/mt_rouge_porter_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0) << "mkstemp failed";
  std::string list;
  for (const std::string& w : words) list += w + "\n";
  size_t written = 0;
  while (written < list.size()) {
    const ssize_t n = write(fd, list.data() + written, list.size() - written);
    if (n <= 0) break;
    written += size_t(n);
  }
  close(fd);
  const auto [code, out] = run_command(std::string(kPython) + " -c '" + kNltkStem + "' " + path);
  unlink(path);
  ASSERT_EQ(written, list.size()) << "could not write the word list to " << path;
  if (code == 3 || out.rfind("cannot import nltk", 0) == 0)
    FAIL() << "[rouge] " << kPython << " cannot import nltk: install python3-nltk (scripts/install-deps.sh)\n"
           << out;
  ASSERT_EQ(code, 0) << "the NLTK oracle failed:\n" << out.substr(0, 2000);

  std::vector<std::string> stems;
  std::istringstream lines(out);
  for (std::string s; std::getline(lines, s);) stems.push_back(s);
  ASSERT_EQ(stems.size(), words.size()) << "the NLTK oracle answered " << stems.size() << " lines for "
                                        << words.size() << " words:\n" << out.substr(0, 2000);
  size_t same = 0, k = 0;
  std::vector<std::string> mismatches;
  for (const std::string& w : words) {
    const std::string mine = porter_stem(w);
    if (mine == stems[k]) ++same;
    else if (mismatches.size() < 5) mismatches.push_back(w + ": porter_stem " + mine + ", NLTK " + stems[k]);
    ++k;
  }
  std::cout << "[rouge] porter vs NLTK: " << same << "/" << words.size() << " words identical\n";
  for (const std::string& m : mismatches) std::cout << "[rouge]   " << m << "\n";
  EXPECT_EQ(same, words.size()) << "first mismatches above";
}

void expect_score(const RougeScore& s, double p, double r, double f, const char* what) {
  EXPECT_NEAR(s.precision, p, 1e-12) << what;
  EXPECT_NEAR(s.recall, r, 1e-12) << what;
  EXPECT_NEAR(s.fmeasure, f, 1e-12) << what;
}

TEST(Rouge, TheRougeScoreReadmeExample) {
  // rouge-score's README: RougeScorer(['rouge1', 'rougeL'], use_stemmer=True).
  const RougeScores s = rouge("The quick brown fox jumps over the lazy dog", "The quick brown dog jumps on the log.", true);
  expect_score(s.rouge1, 0.75, 6.0 / 9.0, 0.7058823529411765, "rouge1");
  expect_score(s.rougeL, 0.625, 5.0 / 9.0, 0.5882352941176471, "rougeL");
  // rouge2 by hand: target bigrams 8, prediction 7, shared: "the quick", "quick brown", "dog jump"? no —
  // (the quick), (quick brown) only.
  expect_score(s.rouge2, 2.0 / 7.0, 2.0 / 8.0, 2 * (2.0 / 7) * (2.0 / 8) / (2.0 / 7 + 2.0 / 8), "rouge2");
}

TEST(Rouge, TokenizationAndClippedCounts) {
  EXPECT_EQ(rouge_tokenize("Hello, WORLD!! it's 2024-11-24 café", false),
            (std::vector<std::string>{"hello", "world", "it", "s", "2024", "11", "24", "caf"}));
  EXPECT_EQ(rouge_tokenize("The runners were running", true), (std::vector<std::string>{"the", "runner", "were", "run"}));
  // "the the the" against "the cat": the prediction's "the" matches once (clipped).
  expect_score(rouge("the cat", "the the the").rouge1, 1.0 / 3.0, 0.5, 0.4, "clipped");
  expect_score(rouge("", "anything").rouge1, 0, 0, 0, "empty target");
  expect_score(rouge("a b", "").rougeL, 0, 0, 0, "empty prediction");
  expect_score(rouge("same words here", "same words here").rouge2, 1, 1, 1, "identical");
}

TEST(Rouge, SummaryLevelLcsOverSentences) {
  // Worked by hand (see rouge.cpp's union LCS): sentence boundaries cost one hit.
  const RougeScores s = rouge("the cat sat\non the mat", "the cat\nsat on the mat");
  expect_score(s.rougeL, 1, 1, 1, "rougeL ignores newlines");
  expect_score(s.rougeLsum, 5.0 / 6.0, 5.0 / 6.0, 5.0 / 6.0, "rougeLsum");
  // Empty lines are not sentences.
  expect_score(rouge("a b c\n\n", "a b c").rougeLsum, 1, 1, 1, "blank lines");
}

TEST(Rouge, MeanOverPairs) {
  const RougeScores m = mean_rouge({"hello there", "general kenobi"}, {"hello there", "general grievous"});
  expect_score(m.rouge1, 0.75, 0.75, 0.75, "mean rouge1");
  expect_score(m.rouge2, 0.5, 0.5, 0.5, "mean rouge2");
  expect_error([] { mean_rouge({"a"}, {}); }, {"1 targets but 0 predictions"});
}

TEST(Rouge, StemsAsRougeScoresNltkStemmerDoes) {
  // rouge-score stems only tokens of more than 3 characters, with NLTK's PorterStemmer().
  // Target "the ties" -> [the, tie]: NLTK keeps a four-letter "-ies" word's "ie" (the 1980
  // rules give "ti"). Prediction "the tie" -> [the, tie]: "tie" is too short to stem. Both
  // unigrams and the one bigram match, so every score is 1; with the paper's "ti" rouge1
  // would be 1/2 and rouge2 0.
  const RougeScores s = rouge("the ties", "the tie", true);
  expect_score(s.rouge1, 1, 1, 1, "ties rouge1");
  expect_score(s.rouge2, 1, 1, 1, "ties rouge2");
  expect_score(s.rougeL, 1, 1, 1, "ties rougeL");
  expect_score(s.rougeLsum, 1, 1, 1, "ties rougeLsum");
  // Unstemmed, only "the" matches: 1/2.
  expect_score(rouge("the ties", "the tie", false).rouge1, 0.5, 0.5, 0.5, "ties unstemmed");
  // Target [the, tie, were, die] ("dying" is in NLTK's irregular pool; "were" keeps its e, its
  // stem "wer" ending cvc), prediction [a, tie, was, die] ("was" and "die" too short to stem,
  // "dying" -> "die" again): tie and die match, 2 of 4 tokens each side: 1/2. No bigram is
  // shared: 0. The LCS is (tie, die): 1/2. The paper's rules ("ti" and "dy" in the target, "dy"
  // in the prediction) would match only "dy": 1/4.
  const RougeScores d = rouge("The ties were dying.", "A tie was dying", true);
  expect_score(d.rouge1, 0.5, 0.5, 0.5, "dying rouge1");
  expect_score(d.rouge2, 0, 0, 0, "dying rouge2");
  expect_score(d.rougeL, 0.5, 0.5, 0.5, "dying rougeL");
}
}  // namespace
}  // namespace mt::testing
