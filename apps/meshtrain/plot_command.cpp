// `meshtrain plot RUN_DIR... [--metric NAME] [-o out.svg]`: overlays the curves of several
// runs (their metrics.jsonl) in one SVG, e.g. 1 process against 4, or f32 against bf16.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "apps/meshtrain/commands.h"
#include "meshtrain/io/mapped_file.h"
#include "meshtrain/train/curves_svg.h"

namespace mt::cli {
namespace {

struct PlotOptions {
  std::vector<std::string> runs;
  std::string metric;
  std::string output = "curves.svg";
};

void run_plot(const PlotOptions& o) {
  // Each run's legend: its folder's own name, also for ".", "./", "../run/" and a metrics.jsonl
  // path (resolved against the working directory); with its parent's when two runs share it.
  std::vector<std::filesystem::path> folders;
  for (const std::string& dir : o.runs) {
    std::error_code ec;
    std::filesystem::path full = std::filesystem::weakly_canonical(std::filesystem::absolute(dir), ec);
    if (!full.has_filename()) full = full.parent_path();
    if (!std::filesystem::is_directory(full)) full = full.parent_path();  // a metrics.jsonl file
    folders.push_back(full);
  }
  std::vector<train::RunMetrics> runs;
  for (size_t i = 0; i < o.runs.size(); ++i) {
    std::string label = folders[i].filename().string();
    for (size_t k = 0; k < folders.size(); ++k)
      if (k != i && folders[k].filename() == folders[i].filename())
        label = (folders[i].parent_path().filename() / folders[i].filename()).string();
    runs.push_back(train::read_run_metrics(o.runs[i], label.empty() ? o.runs[i] : label));
  }
  // A run without the metric draws no curve: say which (a run whose batches were padded to
  // their longest rows logs examples_per_s where a fixed-length one logs tokens_per_s).
  for (const train::RunMetrics& r : runs) {
    if (o.metric.empty()) continue;
    bool has = false;
    for (const auto& [key, points] : r.series) has = has || (key.second == o.metric && !points.empty());
    if (!has) std::cerr << "plot: " << r.label << " logged no '" << o.metric << "'; it has no curve here\n";
  }
  train::CurvesOptions co;
  co.metric = o.metric;
  co.title = o.metric.empty() ? "training curves" : o.metric;
  if (const auto folder = std::filesystem::path(o.output).parent_path(); !folder.empty())
    std::filesystem::create_directories(folder);  // as the training commands make their output folders
  io::write_file_atomic(o.output, train::render_curves_svg(runs, co));
  std::cout << "wrote " << o.output << " (" << runs.size() << " run" << (runs.size() == 1 ? "" : "s") << ")\n";
}

}  // namespace

void add_plot_command(CLI::App& app) {
  auto o = std::make_shared<PlotOptions>();
  CLI::App* cmd = app.add_subcommand("plot", "draw the curves of one or more runs (their metrics.jsonl) as one SVG");
  cmd->add_option("runs", o->runs, "run directories (or metrics.jsonl files) to overlay")->required();
  cmd->add_option("--metric", o->metric, "only this metric, e.g. eval_loss, loss, lr, accuracy (default: every panel)");
  cmd->add_option("-o,--output", o->output, "the SVG to write")->capture_default_str();
  cmd->callback([o] { run_plot(*o); });
}

}  // namespace mt::cli
