#include "meshtrain/train/metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <numeric>

#include "meshtrain/core/error.h"

namespace mt::train {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

template <class T>
void check_pair(const char* op, std::span<const T> a, std::span<const T> b, size_t min_size = 1) {
  MT_CHECK(a.size() == b.size(), "[", op, "] predictions and labels differ in length: ", a.size(), " vs ",
           b.size());
  MT_CHECK(a.size() >= min_size, "[", op, "] needs at least ", min_size, " element(s), got ", a.size());
}

bool has_nan(std::span<const double> x) {
  return std::any_of(x.begin(), x.end(), [](double v) { return std::isnan(v); });
}

// Compared exactly, not via the centered sum of squares: the rounded mean of equal values
// can differ from them and leave a tiny non-zero spread.
bool is_constant(std::span<const double> x) {
  return std::all_of(x.begin(), x.end(), [&](double v) { return v == x[0]; });
}

}  // namespace

double accuracy(std::span<const int64_t> predictions, std::span<const int64_t> labels) {
  check_pair("accuracy", predictions, labels);
  size_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) correct += predictions[i] == labels[i];
  return double(correct) / double(labels.size());
}

double f1_score(std::span<const int64_t> predictions, std::span<const int64_t> labels) {
  check_pair("f1_score", predictions, labels);
  int64_t tp = 0, fp = 0, fn = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    MT_CHECK((labels[i] == 0 || labels[i] == 1) && (predictions[i] == 0 || predictions[i] == 1),
             "[f1_score] binary F1 needs classes 0/1, got prediction ", predictions[i], " and label ", labels[i],
             " at index ", i);
    tp += predictions[i] == 1 && labels[i] == 1;
    fp += predictions[i] == 1 && labels[i] == 0;
    fn += predictions[i] == 0 && labels[i] == 1;
  }
  // 2TP / (2TP + FP + FN) equals the harmonic mean of precision and recall.
  if (tp + fp + fn == 0) return 0.0;
  return 2.0 * double(tp) / double(2 * tp + fp + fn);
}

double matthews_corrcoef(std::span<const int64_t> predictions, std::span<const int64_t> labels) {
  check_pair("matthews_corrcoef", predictions, labels);
  // Per-class counts of labels (t), predictions (p); the multiclass MCC only needs these
  // marginals and the number correct.
  std::map<int64_t, double> t_sum, p_sum;
  double correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    t_sum[labels[i]] += 1;
    p_sum[predictions[i]] += 1;
    correct += predictions[i] == labels[i];
  }
  double n = double(labels.size());
  double tp_dot = 0, pp = 0, tt = 0;
  for (auto& [c, t] : t_sum) {
    tt += t * t;
    auto it = p_sum.find(c);
    if (it != p_sum.end()) tp_dot += t * it->second;
  }
  for (auto& [c, p] : p_sum) pp += p * p;
  double cov_tp = correct * n - tp_dot;
  double cov_pp = n * n - pp;
  double cov_tt = n * n - tt;
  if (cov_pp * cov_tt == 0) return 0.0;
  return cov_tp / std::sqrt(cov_tt * cov_pp);
}

double pearson(std::span<const double> x, std::span<const double> y) {
  check_pair("pearson", x, y, 2);
  if (has_nan(x) || has_nan(y)) return kNaN;
  // Constant input has no defined correlation; scipy returns NaN (with a warning) too.
  if (is_constant(x) || is_constant(y)) return kNaN;
  size_t n = x.size();
  double mx = std::accumulate(x.begin(), x.end(), 0.0) / double(n);
  double my = std::accumulate(y.begin(), y.end(), 0.0) / double(n);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    double dx = x[i] - mx, dy = y[i] - my;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  return std::clamp(sxy / (std::sqrt(sxx) * std::sqrt(syy)), -1.0, 1.0);
}

std::vector<double> average_ranks(std::span<const double> x) {
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> ranks(x.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) ++j;
    double r = 0.5 * double(i + j) + 1.0;  // mean of the 1-based ranks i+1 .. j+1
    for (size_t k = i; k <= j; ++k) ranks[order[k]] = r;
    i = j + 1;
  }
  return ranks;
}

double spearman(std::span<const double> x, std::span<const double> y) {
  check_pair("spearman", x, y, 2);
  if (has_nan(x) || has_nan(y)) return kNaN;  // ranks of NaN are undefined
  std::vector<double> rx = average_ranks(x), ry = average_ranks(y);
  return pearson(rx, ry);
}

double perplexity(double mean_nll) { return std::exp(mean_nll); }

double perplexity(std::span<const double> token_nlls) {
  MT_CHECK(!token_nlls.empty(), "[perplexity] no token losses given");
  return std::exp(std::accumulate(token_nlls.begin(), token_nlls.end(), 0.0) / double(token_nlls.size()));
}

const std::vector<std::string>& glue_tasks() {
  static const std::vector<std::string> tasks{"cola", "sst2", "mrpc",          "stsb",            "qqp", "mnli",
                                              "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli"};
  return tasks;
}

namespace {

std::string normalize_task(const std::string& task) {
  std::string out;
  for (char c : task) {
    if (c == '-') continue;
    out += char(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::vector<int64_t> as_classes(const std::string& task, const char* what, std::span<const double> v) {
  std::vector<int64_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    MT_CHECK(std::isfinite(v[i]) && v[i] == std::round(v[i]), "[glue_metrics] task ", task,
             " expects integer class ", what, ", got ", v[i], " at index ", i);
    out[i] = int64_t(v[i]);
  }
  return out;
}

}  // namespace

std::map<std::string, double> glue_metrics(const std::string& task, std::span<const double> predictions,
                                           std::span<const double> labels) {
  std::string t = normalize_task(task);
  const auto& tasks = glue_tasks();
  if (std::find(tasks.begin(), tasks.end(), t) == tasks.end()) {
    std::string valid;
    for (const auto& name : tasks) valid += (valid.empty() ? "" : ", ") + name;
    throw Error("[glue_metrics] unknown GLUE task '" + task + "'; valid tasks: " + valid);
  }
  MT_CHECK(predictions.size() == labels.size(), "[glue_metrics] task ", t,
           ": predictions and labels differ in length: ", predictions.size(), " vs ", labels.size());
  MT_CHECK(!labels.empty(), "[glue_metrics] task ", t, ": no examples");
  std::map<std::string, double> out;
  if (t == "stsb") {
    out["pearson"] = pearson(predictions, labels);
    out["spearmanr"] = spearman(predictions, labels);
    out["combined_score"] = 0.5 * (out["pearson"] + out["spearmanr"]);
    return out;
  }
  std::vector<int64_t> p = as_classes(t, "predictions", predictions);
  std::vector<int64_t> l = as_classes(t, "labels", labels);
  if (t == "cola") {
    out["matthews_correlation"] = matthews_corrcoef(p, l);
  } else if (t == "mrpc" || t == "qqp") {
    out["accuracy"] = accuracy(p, l);
    out["f1"] = f1_score(p, l);
    out["combined_score"] = 0.5 * (out["accuracy"] + out["f1"]);  // run_glue's mean of the two
  } else {
    out["accuracy"] = accuracy(p, l);
  }
  return out;
}

std::map<std::string, double> glue_metrics(const std::string& task, std::span<const int64_t> predictions,
                                           std::span<const int64_t> labels) {
  std::vector<double> p(predictions.begin(), predictions.end()), l(labels.begin(), labels.end());
  return glue_metrics(task, p, l);
}

}  // namespace mt::train
