#pragma once
// Loss curves as a picture, without a plotting dependency: metrics.jsonl -> an SVG of stacked
// panels on a shared step axis — train loss (raw and smoothed) with the eval loss, the other
// eval metrics, the learning rate, throughput — with axis labels, units and legends. Several
// runs overlay in one picture (`meshtrain plot`), one colour per run.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mt::train {

// One run's logged scalars: (split, metric) -> (step, value) in file order; null values are NaN.
struct RunMetrics {
  std::string label;  // the legend's name for the run
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<int64_t, double>>> series;
};
// Reads <run_dir>/metrics.jsonl (or a metrics.jsonl path); throws naming the file and line.
RunMetrics read_run_metrics(const std::string& run_dir_or_file, const std::string& label);

struct CurvesOptions {
  std::string title{};
  // Only this metric ("eval_loss", "loss", "lr", "accuracy", ...), in one panel; empty: all panels.
  std::string metric{};
  double smoothing = 0.9;  // exponential moving average of the train loss (TensorBoard's slider)
};
std::string render_curves_svg(const std::vector<RunMetrics>& runs, const CurvesOptions& options = {});

// <run_dir>/metrics.jsonl -> <run_dir>/curves.svg (atomically); returns the SVG's path.
std::string write_run_curves(const std::string& run_dir);

}  // namespace mt::train
