#include "meshtrain/train/curves_svg.h"

#include "meshtrain/train/host_transfer_counters.h"
#include "meshtrain/train/memory_usage.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/core/spelling.h"
#include "meshtrain/io/mapped_file.h"

namespace mt::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

RunMetrics read_run_metrics(const std::string& run_dir_or_file, const std::string& label) {
  const fs::path path = fs::is_directory(run_dir_or_file) ? fs::path(run_dir_or_file) / "metrics.jsonl"
                                                           : fs::path(run_dir_or_file);
  std::ifstream in(path);
  MT_CHECK(in.good(), "[plot] cannot read ", path.string(),
           ": give a run directory (it holds metrics.jsonl) or a metrics.jsonl file");
  RunMetrics run;
  run.label = label;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      // A last line without its newline is a record still being written (a run in progress,
      // or one killed mid-line): the curves end before it. Elsewhere a bad line is an error.
      if (in.eof()) break;
      throw Error(detail::concat("[plot] ", path.string(), ":", number, ": not JSON: ", e.what()));
    }
    MT_CHECK(j.is_object() && j.contains("step") && j["step"].is_number_integer(), "[plot] ", path.string(), ":", number,
             ": a record needs an integer \"step\"");
    const int64_t step = j["step"].get<int64_t>();
    const std::string split = j.value("split", "train");
    for (const auto& [key, value] : j.items()) {
      if (key == "step" || key == "split") continue;
      if (!value.is_number() && !value.is_null()) continue;
      run.series[{split, key}].emplace_back(step, value.is_null() ? std::nan("") : value.get<double>());
    }
  }
  return run;
}

namespace {

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
constexpr double kWidth = 900, kLeft = 78, kRight = 24, kPanelHeight = 210, kTop = 62, kGap = 62;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string tick_label(double v) {
  char buf[32];
  if (std::abs(v) >= 1e4 && std::abs(v) < 1e12) std::snprintf(buf, sizeof buf, "%.0f", v);  // 20000, not 2e+04
  else std::snprintf(buf, sizeof buf, "%.4g", std::abs(v) < 1e-12 ? 0.0 : v);
  return buf;
}

// Round tick spacing: 1, 2 or 5 times a power of ten, about `n` ticks over [lo, hi].
double nice_step(double lo, double hi, int n) {
  const double raw = (hi - lo) / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

struct Line {
  std::string id;      // "run/split/metric[/smoothed]"
  std::string legend;
  std::string color;
  std::string style;   // extra SVG attributes
  std::vector<std::pair<int64_t, double>> points;
};

struct Panel {
  std::string title, y_label;
  std::vector<Line> lines;
};

std::vector<std::pair<int64_t, double>> smoothed(const std::vector<std::pair<int64_t, double>>& pts, double w) {
  // Exponential moving average with the start-up bias removed (as TensorBoard draws it).
  std::vector<std::pair<int64_t, double>> out;
  double avg = 0, weight = 0;
  for (const auto& [step, v] : pts) {
    if (!std::isfinite(v)) {
      out.emplace_back(step, v);
      continue;
    }
    avg = w * avg + (1 - w) * v;
    weight = w * weight + (1 - w);
    out.emplace_back(step, avg / weight);
  }
  return out;
}

std::string metric_unit(const std::string& metric) {
  if (metric == "loss" || metric == "eval_loss") return "loss (nats per token)";
  if (metric == "lr") return "learning rate";
  if (metric == "tokens_per_s") return "tokens/s";
  if (metric == "examples_per_s") return "examples/s";
  return metric;
}

std::vector<Panel> make_panels(const std::vector<RunMetrics>& runs, const CurvesOptions& o) {
  std::vector<Panel> panels;
  auto color = [](size_t run) { return std::string(kColors[run % (sizeof kColors / sizeof *kColors)]); };
  auto who = [&](size_t r) { return runs.size() > 1 ? runs[r].label + ": " : std::string(); };
  if (!o.metric.empty()) {
    Panel p{o.metric, metric_unit(o.metric), {}};
    for (size_t r = 0; r < runs.size(); ++r)
      for (const auto& [key, pts] : runs[r].series)
        if (key.second == o.metric)
          p.lines.push_back({runs[r].label + "/" + key.first + "/" + key.second, who(r) + key.first + " " + key.second,
                             color(r), "stroke-width=\"2\"", pts});
    if (p.lines.empty()) {
      std::set<std::string> logged;
      for (const RunMetrics& run : runs)
        for (const auto& [key, pts] : run.series) logged.insert(key.second);
      std::string list;
      for (const std::string& m : logged) list += (list.empty() ? "" : ", ") + m;
      const std::string near = nearest_spelling(o.metric, std::vector<std::string>(logged.begin(), logged.end()));
      throw Error(detail::concat("[plot] no run logged a metric named '", o.metric, "'",
                                 near.empty() ? "" : " (did you mean '" + near + "'?)", "; logged: ", list));
    }
    panels.push_back(p);
    return panels;
  }
  Panel loss{"loss", "loss (nats per token)", {}}, evals{"eval metrics", "value", {}}, lr{"learning rate", "learning rate", {}},
      speed{"throughput", "", {}}, memory{"memory", "GB", {}};
  std::map<std::string, Panel> method;
  for (size_t r = 0; r < runs.size(); ++r) {
    const std::string base = runs[r].label + "/";
    for (const auto& [key, pts] : runs[r].series) {
      const auto& [split, metric] = key;
      const std::string id = base + split + "/" + metric;
      if (split == "train" && metric == "loss") {
        loss.lines.push_back({id, who(r) + "train loss", color(r), "stroke-width=\"1\" stroke-opacity=\"0.35\"", pts});
        loss.lines.push_back({id + "/smoothed", who(r) + "train loss (smoothed)", color(r), "stroke-width=\"2\"",
                              smoothed(pts, o.smoothing)});
      } else if (split == "eval" && metric == "eval_loss") {
        loss.lines.push_back({id, who(r) + "eval loss", color(r), "stroke-width=\"2\" stroke-dasharray=\"6 3\"", pts});
      } else if (split == "eval") {
        evals.lines.push_back({id, who(r) + metric, color(r), "stroke-width=\"2\" stroke-dasharray=\"6 3\"", pts});
      } else if (metric == "lr") {
        lr.lines.push_back({id, who(r) + "learning rate", color(r), "stroke-width=\"2\"", pts});
      } else if (is_memory_metric(metric)) {
        const bool peak = is_peak_memory_metric(metric);
        memory.lines.push_back({id, who(r) + metric, color(r),
                                peak ? "stroke-width=\"2\"" : "stroke-width=\"1\" stroke-dasharray=\"4 2\"", pts});
      } else if (metric == "tokens_per_s" || metric == "examples_per_s") {
        speed.y_label = metric_unit(metric);
        speed.lines.push_back({id, who(r) + metric_unit(metric), color(r), "stroke-width=\"1.5\"", pts});
      } else if (split == "train" && metric != "mfu" && metric != "model_flops_per_s" &&
                 !is_host_transfer_counter(metric)) {
        // A method's own metrics (train/step_metrics.h): one panel per group, "rewards/chosen"
        // and "rewards/rejected" together, since a group shares a scale.
        const std::string group = metric.substr(0, metric.find('/'));
        Panel& p = method[group];
        p.title = p.y_label = group;
        // One run: a color per line of the group, so chosen and rejected can be told apart.
        p.lines.push_back({id, who(r) + metric, runs.size() > 1 ? color(r) : color(p.lines.size()),
                           "stroke-width=\"1.5\"", pts});
      }
    }
  }
  for (Panel* p : {&loss, &evals, &lr, &speed, &memory})
    if (!p->lines.empty()) panels.push_back(*p);
  for (const auto& [group, p] : method) panels.push_back(p);
  return panels;
}

}  // namespace

std::string render_curves_svg(const std::vector<RunMetrics>& runs, const CurvesOptions& o) {
  std::vector<Panel> panels = make_panels(runs, o);
  // The shared step axis.
  int64_t x_lo = std::numeric_limits<int64_t>::max(), x_hi = std::numeric_limits<int64_t>::min();
  for (const Panel& p : panels)
    for (const Line& l : p.lines)
      for (const auto& [step, v] : l.points) x_lo = std::min(x_lo, step), x_hi = std::max(x_hi, step);
  if (x_lo > x_hi) x_lo = 0, x_hi = 1;
  double xa = double(x_lo), xb = double(x_hi);
  if (xb <= xa) xa -= 1, xb += 1;
  const double plot_w = kWidth - kLeft - kRight;
  const double height = kTop + double(std::max<size_t>(panels.size(), 1)) * (kPanelHeight + kGap);
  auto X = [&](double step) { return kLeft + (step - xa) / (xb - xa) * plot_w; };

  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(kWidth) << "\" height=\"" << num(height)
      << "\" viewBox=\"0 0 " << num(kWidth) << " " << num(height) << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << num(kLeft) << "\" y=\"24\" font-size=\"15\" font-weight=\"bold\">"
      << escape(o.title.empty() ? "training curves" : o.title) << "</text>\n";
  if (panels.empty())
    svg << "<text x=\"" << num(kLeft) << "\" y=\"" << num(kTop + 40) << "\">no metrics logged yet</text>\n";
  for (size_t pi = 0; pi < panels.size(); ++pi) {
    const Panel& p = panels[pi];
    const double top = kTop + double(pi) * (kPanelHeight + kGap), bottom = top + kPanelHeight;
    double ya = std::numeric_limits<double>::infinity(), yb = -ya;
    for (const Line& l : p.lines)
      for (const auto& [step, v] : l.points)
        if (std::isfinite(v)) ya = std::min(ya, v), yb = std::max(yb, v);
    if (!(ya <= yb)) ya = 0, yb = 1;
    if (yb - ya < 1e-12 * std::max(1.0, std::abs(ya))) {
      const double pad = std::abs(ya) > 0 ? std::abs(ya) * 0.1 : 1.0;
      ya -= pad, yb += pad;
    }
    auto Y = [&](double v) { return bottom - (v - ya) / (yb - ya) * kPanelHeight; };
    svg << "<g class=\"panel\" data-title=\"" << escape(p.title) << "\">\n"
        << "<text x=\"" << num(kLeft) << "\" y=\"" << num(top - 8) << "\" font-weight=\"bold\">" << escape(p.title)
        << "</text>\n"
        << "<rect x=\"" << num(kLeft) << "\" y=\"" << num(top) << "\" width=\"" << num(plot_w) << "\" height=\""
        << num(kPanelHeight) << "\" fill=\"none\" stroke=\"#888\"/>\n";
    // Grid and ticks.
    const double ys = nice_step(ya, yb, 5);
    for (double t = std::ceil(ya / ys) * ys; t <= yb + 1e-9 * ys; t += ys)
      svg << "<line x1=\"" << num(kLeft) << "\" x2=\"" << num(kLeft + plot_w) << "\" y1=\"" << num(Y(t)) << "\" y2=\""
          << num(Y(t)) << "\" stroke=\"#eee\"/><text x=\"" << num(kLeft - 6) << "\" y=\"" << num(Y(t) + 4)
          << "\" text-anchor=\"end\">" << tick_label(t) << "</text>\n";
    const double xs = std::max(1.0, nice_step(xa, xb, 8));
    for (double t = std::ceil(xa / xs) * xs; t <= xb + 1e-9; t += xs)
      svg << "<line x1=\"" << num(X(t)) << "\" x2=\"" << num(X(t)) << "\" y1=\"" << num(top) << "\" y2=\"" << num(bottom)
          << "\" stroke=\"#eee\"/><text x=\"" << num(X(t)) << "\" y=\"" << num(bottom + 15)
          << "\" text-anchor=\"middle\">" << tick_label(t) << "</text>\n";
    svg << "<text x=\"" << num(kLeft + plot_w / 2) << "\" y=\"" << num(bottom + 32)
        << "\" text-anchor=\"middle\">optimizer step</text>\n"
        << "<text transform=\"translate(16," << num(top + kPanelHeight / 2) << ") rotate(-90)\" text-anchor=\"middle\">"
        << escape(p.y_label) << "</text>\n";
    // The legend's backdrop, so that it stays readable over the lines.
    const double legend_x = kLeft + plot_w - 236;
    // The series: one polyline each over its finite points, and a dot where there is a single one.
    std::ostringstream legend;
    legend << "<rect x=\"" << num(legend_x) << "\" y=\"" << num(top + 4) << "\" width=\"232\" height=\""
           << num(15 * double(p.lines.size()) + 6) << "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ddd\"/>\n";
    for (size_t li = 0; li < p.lines.size(); ++li) {
      const Line& l = p.lines[li];
      std::string pts;
      int n = 0;
      for (const auto& [step, v] : l.points) {
        if (!std::isfinite(v)) continue;
        pts += (n++ ? " " : "") + num(X(double(step))) + "," + num(Y(v));
      }
      svg << "<polyline class=\"series\" data-series=\"" << escape(l.id) << "\" data-points=\"" << n
          << "\" fill=\"none\" stroke=\"" << l.color << "\" " << l.style << " points=\"" << pts << "\"/>\n";
      if (n == 1) {
        const auto first = *std::find_if(l.points.begin(), l.points.end(), [](const auto& q) { return std::isfinite(q.second); });
        svg << "<circle cx=\"" << num(X(double(first.first))) << "\" cy=\"" << num(Y(first.second)) << "\" r=\"3\" fill=\""
            << l.color << "\"/>\n";
      }
      // Legend, top right, one row per series.
      const double ly = top + 16 + 15 * double(li), lx = legend_x + 6;
      legend << "<line x1=\"" << num(lx) << "\" x2=\"" << num(lx + 24) << "\" y1=\"" << num(ly - 4) << "\" y2=\"" << num(ly - 4)
          << "\" stroke=\"" << l.color << "\" " << l.style << "/><text x=\"" << num(lx + 30) << "\" y=\"" << num(ly)
          << "\">" << escape(l.legend) << "</text>\n";
    }
    svg << legend.str() << "</g>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

std::string write_run_curves(const std::string& run_dir) {
  const RunMetrics run = read_run_metrics(run_dir, fs::path(run_dir).filename().string());
  CurvesOptions o;
  o.title = "training curves: " + run_dir;
  const std::string path = (fs::path(run_dir) / "curves.svg").string();
  io::write_file_atomic(path, render_curves_svg({run}, o));
  return path;
}

}  // namespace mt::train
