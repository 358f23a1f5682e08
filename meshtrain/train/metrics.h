#pragma once
// Evaluation metrics with scikit-learn / scipy semantics (the numbers HF's run_glue
// reports), and the GLUE task -> metrics mapping of DESIGN.md §7.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace mt::train {

// Fraction of positions where prediction == label.
double accuracy(std::span<const int64_t> predictions, std::span<const int64_t> labels);
// Binary F1 of the positive class 1 (sklearn average="binary"); labels and predictions must
// be 0 or 1. 0 when there are no true and no predicted positives (sklearn's zero_division).
double f1_score(std::span<const int64_t> predictions, std::span<const int64_t> labels);
// Matthews correlation from the confusion matrix, any number of classes (sklearn's
// formula); 0 when either side holds a single class.
double matthews_corrcoef(std::span<const int64_t> predictions, std::span<const int64_t> labels);
// Pearson's r (scipy.stats.pearsonr). NaN when either input is constant (scipy warns and
// returns NaN) or holds a NaN; at least 2 points.
double pearson(std::span<const double> x, std::span<const double> y);
// Spearman's rho = Pearson of average ranks (scipy.stats.spearmanr, ties share the mean
// rank). NaN for constant input or any NaN.
double spearman(std::span<const double> x, std::span<const double> y);
// 1-based ranks, ties get the average of the ranks they span (scipy rankdata "average").
std::vector<double> average_ranks(std::span<const double> x);
// exp(mean negative log-likelihood per token).
double perplexity(double mean_nll);
double perplexity(std::span<const double> token_nlls);

// GLUE metrics keyed like HF evaluate's glue metric, plus "combined_score" (their mean)
// when a task has two: cola -> matthews_correlation; stsb -> pearson, spearmanr; mrpc,
// qqp -> accuracy, f1; sst2, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli ->
// accuracy. Classification tasks need integer-valued predictions/labels. Task names are
// case-insensitive and ignore '-' ("SST-2"). Unknown task -> mt::Error listing the tasks.
std::map<std::string, double> glue_metrics(const std::string& task, std::span<const double> predictions,
                                           std::span<const double> labels);
std::map<std::string, double> glue_metrics(const std::string& task, std::span<const int64_t> predictions,
                                           std::span<const int64_t> labels);
// The task names glue_metrics accepts (normalized spelling).
const std::vector<std::string>& glue_tasks();

}  // namespace mt::train
