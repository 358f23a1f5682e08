// Metrics against scikit-learn / scipy (Debian python3-sklearn, python3-scipy) on random
// predictions of several sizes and on degenerate inputs (one class, constant values).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "meshtrain/meshtrain.h"
#include "tests/support/torch_oracle.h"

namespace mt::testing {
namespace {

using namespace mt::train;

constexpr double kTol = 1e-12;

OracleTensor f64(const std::vector<double>& v) { return OracleTensor{{int64_t(v.size())}, "float64", v}; }
std::vector<double> as_double(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// Runs `code` (sees p = predictions, l = labels as numpy float64 arrays and sets `res`, a
// list of floats) in the oracle worker with sklearn/scipy imported.
std::vector<double> oracle(const std::string& code, const std::vector<double>& p, const std::vector<double>& l) {
  std::string full =
      "import warnings\n"
      "warnings.simplefilter('ignore')\n"
      "from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef\n"
      "from scipy.stats import pearsonr, spearmanr\n"
      "p = x0.numpy(); l = x1.numpy()\n"
      "pi = p.astype(np.int64); li = l.astype(np.int64)\n" +
      code + "\nout = torch.tensor([float(v) for v in res], dtype=torch.float64)\n";
  return TorchOracle::instance().run(full, {f64(p), f64(l)}).outputs.at(0).data;
}

// NaN must match NaN (scipy's answer for constant input); otherwise |a - b| <= kTol.
double check(double ours, double ref, const std::string& label) {
  if (std::isnan(ref)) {
    EXPECT_TRUE(std::isnan(ours)) << label << ": ours " << ours << ", reference NaN";
    return 0;
  }
  double err = std::fabs(ours - ref);
  EXPECT_LE(err, kTol) << label << ": ours " << ours << ", reference " << ref;
  return err;
}

std::vector<int64_t> random_classes(size_t n, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> d(0, classes - 1);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Labels with predictions that agree with them ~70% of the time, so metrics are not ~0.
std::vector<int64_t> noisy_copy(const std::vector<int64_t>& labels, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<int64_t> d(0, classes - 1);
  std::vector<int64_t> v = labels;
  for (auto& x : v)
    if (u(rng) < 0.3) x = d(rng);
  return v;
}

struct ClassCase {
  std::string name;
  std::vector<int64_t> predictions, labels;
};

std::vector<ClassCase> binary_cases() {
  std::vector<ClassCase> cases;
  for (size_t n : {1, 2, 3, 7, 100, 1001, 4096}) {
    auto l = random_classes(n, 2, n);
    cases.push_back({"random n=" + std::to_string(n), random_classes(n, 2, n + 7), l});
    cases.push_back({"correlated n=" + std::to_string(n), noisy_copy(l, 2, n + 9), l});
  }
  auto l = random_classes(50, 2, 3);
  cases.push_back({"all predictions 1", std::vector<int64_t>(50, 1), l});
  cases.push_back({"all predictions 0", std::vector<int64_t>(50, 0), l});
  cases.push_back({"all labels 1", l, std::vector<int64_t>(50, 1)});
  cases.push_back({"all zero both (no positives)", std::vector<int64_t>(50, 0), std::vector<int64_t>(50, 0)});
  cases.push_back({"all one both", std::vector<int64_t>(50, 1), std::vector<int64_t>(50, 1)});
  cases.push_back({"perfect", l, l});
  std::vector<int64_t> flipped = l;
  for (auto& x : flipped) x = 1 - x;
  cases.push_back({"perfectly wrong", flipped, l});
  return cases;
}

TEST(Metrics, BinaryAccuracyF1MatthewsMatchSklearn) {
  double max_err = 0;
  for (const auto& c : binary_cases()) {
    auto ref = oracle("res = [accuracy_score(li, pi), f1_score(li, pi), matthews_corrcoef(li, pi)]",
                      as_double(c.predictions), as_double(c.labels));
    max_err = std::max(max_err, check(accuracy(c.predictions, c.labels), ref[0], c.name + " accuracy"));
    max_err = std::max(max_err, check(f1_score(c.predictions, c.labels), ref[1], c.name + " f1"));
    max_err = std::max(max_err, check(matthews_corrcoef(c.predictions, c.labels), ref[2], c.name + " mcc"));
  }
  std::printf("binary accuracy/f1/mcc: max |ours - sklearn| = %.3g\n", max_err);
}

TEST(Metrics, MulticlassAccuracyAndMatthewsMatchSklearn) {
  double max_err = 0;
  std::vector<ClassCase> cases;
  for (size_t n : {2, 5, 64, 999, 3000}) {
    for (int k : {3, 5}) {
      auto l = random_classes(n, k, n * 10 + size_t(k));
      cases.push_back({"k=" + std::to_string(k) + " n=" + std::to_string(n), noisy_copy(l, k, n + 1), l});
    }
  }
  cases.push_back({"one predicted class", std::vector<int64_t>(30, 2), random_classes(30, 3, 1)});
  cases.push_back({"class only in predictions", random_classes(30, 4, 2), random_classes(30, 2, 3)});
  for (const auto& c : cases) {
    auto ref = oracle("res = [accuracy_score(li, pi), matthews_corrcoef(li, pi)]", as_double(c.predictions),
                      as_double(c.labels));
    max_err = std::max(max_err, check(accuracy(c.predictions, c.labels), ref[0], c.name + " accuracy"));
    max_err = std::max(max_err, check(matthews_corrcoef(c.predictions, c.labels), ref[1], c.name + " mcc"));
  }
  std::printf("multiclass accuracy/mcc: max |ours - sklearn| = %.3g\n", max_err);
}

struct RealCase {
  std::string name;
  std::vector<double> x, y;
};

std::vector<double> random_normal(size_t n, uint64_t seed, double round_to = 0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0, 1);
  std::vector<double> v(n);
  for (auto& x : v) {
    x = d(rng);
    if (round_to > 0) x = std::round(x / round_to) * round_to;  // creates ties
  }
  return v;
}

TEST(Metrics, PearsonSpearmanMatchScipy) {
  std::vector<RealCase> cases;
  for (size_t n : {2, 3, 10, 257, 5000}) {
    auto x = random_normal(n, n);
    auto y = random_normal(n, n + 1);
    for (size_t i = 0; i < n; ++i) y[i] = 0.6 * x[i] + 0.8 * y[i];
    cases.push_back({"normal n=" + std::to_string(n), x, y});
    cases.push_back({"ties n=" + std::to_string(n), random_normal(n, n + 2, 0.5), random_normal(n, n + 3, 0.5)});
  }
  std::vector<double> stsb_labels, stsb_preds;  // STS-B style: scores in [0, 5]
  for (int i = 0; i < 200; ++i) {
    stsb_labels.push_back(std::round(std::fmod(i * 0.37, 5.0) * 5) / 5);
    stsb_preds.push_back(stsb_labels.back() + 0.3 * std::sin(i));
  }
  cases.push_back({"stsb-like", stsb_preds, stsb_labels});
  cases.push_back({"constant predictions", std::vector<double>(20, 2.5), random_normal(20, 4)});
  cases.push_back({"constant labels", random_normal(20, 5), std::vector<double>(20, 0.1)});
  cases.push_back({"both constant", std::vector<double>(7, 1.0), std::vector<double>(7, 3.0)});
  cases.push_back({"perfect", random_normal(30, 6), random_normal(30, 6)});
  cases.push_back({"huge offset", {1e9 + 1, 1e9 + 2, 1e9 + 4, 1e9 + 3}, {1, 2, 3, 4}});

  double max_err = 0;
  for (const auto& c : cases) {
    auto ref = oracle("res = [pearsonr(p, l)[0], spearmanr(p, l)[0]]", c.x, c.y);
    max_err = std::max(max_err, check(pearson(c.x, c.y), ref[0], c.name + " pearson"));
    max_err = std::max(max_err, check(spearman(c.x, c.y), ref[1], c.name + " spearman"));
  }
  std::printf("pearson/spearman: max |ours - scipy| = %.3g\n", max_err);
}

TEST(Metrics, AverageRanksMatchRankdata) {
  auto x = random_normal(101, 9, 0.25);
  auto ref = TorchOracle::instance()
                 .run("from scipy.stats import rankdata\nout = torch.tensor(rankdata(x0.numpy()), dtype=torch.float64)",
                      {f64(x)})
                 .outputs.at(0)
                 .data;
  auto ours = average_ranks(x);
  ASSERT_EQ(ours.size(), ref.size());
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_EQ(ours[i], ref[i]) << i;
}

TEST(Metrics, PerplexityIsExpOfMeanNll) {
  auto nll = random_normal(333, 11);
  for (auto& v : nll) v = std::fabs(v) * 2;
  auto ref = oracle("res = [np.exp(np.mean(p))]", nll, nll);
  double err = std::fabs(perplexity(nll) - ref[0]) / ref[0];
  std::printf("perplexity: relative error %.3g\n", err);
  EXPECT_LE(err, 1e-13);
  EXPECT_DOUBLE_EQ(perplexity(std::log(50.0)), 50.0);
}

// HF run_glue: evaluate's glue metric per task, plus the mean as combined_score when a
// task reports more than one value.
const char* kGlueReference = R"(
def glue(task):
    if task == 'cola':
        r = {'matthews_correlation': matthews_corrcoef(li, pi)}
    elif task == 'stsb':
        r = {'pearson': pearsonr(p, l)[0], 'spearmanr': spearmanr(p, l)[0]}
    elif task in ('mrpc', 'qqp'):
        r = {'accuracy': accuracy_score(li, pi), 'f1': f1_score(li, pi)}
    else:
        r = {'accuracy': accuracy_score(li, pi)}
    if len(r) > 1:
        r['combined_score'] = np.mean(list(r.values())).item()
    return [r[k] for k in sorted(r)]
)";

TEST(Metrics, GlueTasksMatchHfMapping) {
  const std::map<std::string, std::vector<std::string>> expected_keys{
      {"cola", {"matthews_correlation"}},
      {"stsb", {"combined_score", "pearson", "spearmanr"}},
      {"mrpc", {"accuracy", "combined_score", "f1"}},
      {"qqp", {"accuracy", "combined_score", "f1"}},
      {"sst2", {"accuracy"}},
      {"mnli", {"accuracy"}},
      {"mnli_matched", {"accuracy"}},
      {"mnli_mismatched", {"accuracy"}},
      {"qnli", {"accuracy"}},
      {"rte", {"accuracy"}},
      {"wnli", {"accuracy"}}};
  EXPECT_EQ(glue_tasks().size(), expected_keys.size());
  double max_err = 0;
  for (const auto& task : glue_tasks()) {
    std::vector<double> p, l;
    if (task == "stsb") {
      l = random_normal(300, 21);
      p = random_normal(300, 22);
      for (size_t i = 0; i < p.size(); ++i) p[i] = 0.5 * p[i] + l[i];
    } else {
      int k = task.rfind("mnli", 0) == 0 ? 3 : 2;
      auto li = random_classes(300, k, 23);
      l = as_double(li);
      p = as_double(noisy_copy(li, k, 24));
    }
    auto ref = oracle(std::string(kGlueReference) + "res = glue('" + task + "')", p, l);
    auto ours = glue_metrics(task, p, l);
    std::vector<std::string> keys;
    for (const auto& [k, v] : ours) keys.push_back(k);
    ASSERT_EQ(keys, expected_keys.at(task)) << task;
    ASSERT_EQ(ref.size(), keys.size()) << task;
    for (size_t i = 0; i < keys.size(); ++i) max_err = std::max(max_err, check(ours[keys[i]], ref[i], task + " " + keys[i]));
  }
  std::printf("glue_metrics: max |ours - HF reference| = %.3g\n", max_err);

  // Integer overload and spelling variants.
  std::vector<int64_t> pi{1, 0, 1, 1}, li{1, 0, 0, 1};
  EXPECT_EQ(glue_metrics("MRPC", pi, li), glue_metrics("mrpc", as_double(pi), as_double(li)));
  EXPECT_EQ(glue_metrics("SST-2", pi, li).at("accuracy"), 0.75);
  EXPECT_EQ(glue_metrics("STS-B", pi, li).count("pearson"), 1u);
}

TEST(Metrics, ErrorsNameTheProblem) {
  std::vector<int64_t> a{0, 1, 1}, b{0, 1};
  auto msg = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(msg([&] { accuracy(a, b); }), "[accuracy] predictions and labels differ in length: 3 vs 2");
  EXPECT_EQ(msg([&] { accuracy(std::vector<int64_t>{}, std::vector<int64_t>{}); }),
            "[accuracy] needs at least 1 element(s), got 0");
  EXPECT_EQ(msg([&] { f1_score(std::vector<int64_t>{0, 2}, std::vector<int64_t>{0, 1}); }),
            "[f1_score] binary F1 needs classes 0/1, got prediction 2 and label 1 at index 1");
  EXPECT_EQ(msg([&] { pearson(std::vector<double>{1}, std::vector<double>{2}); }),
            "[pearson] needs at least 2 element(s), got 1");
  EXPECT_EQ(msg([&] { perplexity(std::vector<double>{}); }), "[perplexity] no token losses given");
  EXPECT_EQ(msg([&] { glue_metrics("squad", std::vector<double>{1}, std::vector<double>{1}); }),
            "[glue_metrics] unknown GLUE task 'squad'; valid tasks: cola, sst2, mrpc, stsb, qqp, mnli, mnli_matched, "
            "mnli_mismatched, qnli, rte, wnli");
  EXPECT_EQ(msg([&] { glue_metrics("rte", std::vector<double>{1, 0.5}, std::vector<double>{1, 0}); }),
            "[glue_metrics] task rte expects integer class predictions, got 0.5 at index 1");
  EXPECT_EQ(msg([&] { glue_metrics("cola", std::vector<double>{1}, std::vector<double>{1, 0}); }),
            "[glue_metrics] task cola: predictions and labels differ in length: 1 vs 2");
}

TEST(Metrics, NanInputsGiveNanCorrelation) {
  std::vector<double> x{1, 2, NAN, 4}, y{1, 2, 3, 5};
  EXPECT_TRUE(std::isnan(pearson(x, y)));
  EXPECT_TRUE(std::isnan(spearman(x, y)));
}

}  // namespace
}  // namespace mt::testing
