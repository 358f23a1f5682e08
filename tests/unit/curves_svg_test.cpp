// curves.svg: valid XML that rsvg-convert renders, one polyline per series with one point per
// logged step, also for NaN losses and a single step; metrics.jsonl errors name file and line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "meshtrain/core/error.h"
#include "meshtrain/train/curves_svg.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;

class CurvesSvg : public TempDir {
 protected:
  // Writes the SVG; checks it parses as XML and renders; returns {series id -> point count}.
  std::map<std::string, int> check(const std::string& svg, const std::string& name) {
    const fs::path path = dir_ / (name + ".svg");
    std::ofstream(path) << svg;
    const std::string xml = "/usr/bin/python3 -c \"import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])\" " +
                            path.string();
    EXPECT_EQ(std::system(xml.c_str()), 0) << name << ": not well-formed XML";
    const std::string render = "rsvg-convert " + path.string() + " -o " + (dir_ / (name + ".png")).string();
    EXPECT_EQ(std::system(render.c_str()), 0) << name << ": rsvg-convert failed";
    EXPECT_GT(fs::file_size(dir_ / (name + ".png")), 1000u) << name;
    std::map<std::string, int> series;
    std::regex polyline(R"re(<polyline class="series" data-series="([^"]+)" data-points="(\d+)"[^>]* points="([^"]*)")re");
    for (std::sregex_iterator it(svg.begin(), svg.end(), polyline), end; it != end; ++it) {
      const int n = std::stoi((*it)[2].str());
      const std::string pts = (*it)[3].str();
      const int pairs = pts.empty() ? 0 : int(std::count(pts.begin(), pts.end(), ' ')) + 1;
      EXPECT_EQ(pairs, n) << (*it)[1].str();
      EXPECT_TRUE(series.emplace((*it)[1].str(), n).second) << "series drawn twice: " << (*it)[1].str();
    }
    return series;
  }
};

TEST_F(CurvesSvg, EverySeriesOneLineWithAPointPerStep) {
  train::RunMetrics run{"demo", {}};
  for (int s = 1; s <= 50; ++s) {
    run.series[{"train", "loss"}].emplace_back(s, 6.0 * std::exp(-s / 20.0) + 0.1 * std::sin(s));
    run.series[{"train", "lr"}].emplace_back(s, 1e-3 * std::min(1.0, s / 10.0));
    run.series[{"train", "tokens_per_s"}].emplace_back(s, 20000 + 100 * (s % 3));
    run.series[{"train", "rss_gb"}].emplace_back(s, 2.0 + 0.1 * (s % 2));
    run.series[{"train", "peak_rss_gb"}].emplace_back(s, 2.1);
    // Logged by every Trainer run, drawn by none: step diagnostics for metrics.jsonl only.
    run.series[{"train", "host_reads"}].emplace_back(s, 0);
    run.series[{"train", "host_uploads"}].emplace_back(s, 0);
    if (s % 10 == 0) {
      run.series[{"eval", "eval_loss"}].emplace_back(s, 5.0 * std::exp(-s / 25.0));
      run.series[{"eval", "accuracy"}].emplace_back(s, 0.5 + s / 200.0);
    }
  }
  auto series = check(train::render_curves_svg({run}, {.title = "demo"}), "full");
  EXPECT_EQ(series.size(), 8u);  // loss raw + smoothed, eval loss, accuracy, lr, tokens/s, memory now + peak
  EXPECT_EQ(series["demo/train/loss"], 50);
  EXPECT_EQ(series["demo/train/loss/smoothed"], 50);
  EXPECT_EQ(series["demo/eval/eval_loss"], 5);
  EXPECT_EQ(series["demo/eval/accuracy"], 5);
  EXPECT_EQ(series["demo/train/lr"], 50);
  EXPECT_EQ(series["demo/train/tokens_per_s"], 50);
  EXPECT_EQ(series["demo/train/rss_gb"], 50);
  EXPECT_EQ(series["demo/train/peak_rss_gb"], 50);
  // Two runs overlaid on one metric.
  train::RunMetrics other = run;
  other.label = "other";
  auto overlay = check(train::render_curves_svg({run, other}, {.metric = "eval_loss"}), "overlay");
  EXPECT_EQ(overlay.size(), 2u);
  EXPECT_EQ(overlay["other/eval/eval_loss"], 5);
  EXPECT_THROW(train::render_curves_svg({run}, {.metric = "nope"}), Error);
}

TEST_F(CurvesSvg, NanLossesAndASingleStepStillDraw) {
  train::RunMetrics nan_run{"nan", {}};
  for (int s = 1; s <= 6; ++s) nan_run.series[{"train", "loss"}].emplace_back(s, s >= 4 ? std::nan("") : 3.0 - s * 0.1);
  auto series = check(train::render_curves_svg({nan_run}), "nan");
  EXPECT_EQ(series["nan/train/loss"], 3);
  train::RunMetrics all_nan{"all_nan", {}};
  all_nan.series[{"train", "loss"}] = {{1, std::nan("")}, {2, std::nan("")}};
  EXPECT_EQ(check(train::render_curves_svg({all_nan}), "all_nan")["all_nan/train/loss"], 0);
  train::RunMetrics one{"one", {}};
  one.series[{"train", "loss"}] = {{1, 2.5}};
  const std::string svg = train::render_curves_svg({one});
  EXPECT_EQ(check(svg, "one")["one/train/loss"], 1);
  EXPECT_NE(svg.find("<circle"), std::string::npos);  // a lone point is drawn as a dot
  check(train::render_curves_svg({}), "empty");
}

TEST_F(CurvesSvg, ReadsMetricsJsonlAndNamesBadLines) {
  fs::create_directories(dir_ / "run");
  fs::create_directories(dir_ / "bad");
  write("run/metrics.jsonl",
        "{\"step\":1,\"split\":\"train\",\"loss\":2.5,\"lr\":0.001}\n{\"step\":1,\"split\":\"eval\",\"eval_loss\":null}\n");
  train::RunMetrics run = train::read_run_metrics((dir_ / "run").string(), "run");
  EXPECT_EQ((run.series[{"train", "loss"}]), (std::vector<std::pair<int64_t, double>>{{1, 2.5}}));
  EXPECT_TRUE(std::isnan(run.series[{"eval", "eval_loss"}].at(0).second));
  const std::string curves = train::write_run_curves((dir_ / "run").string());
  EXPECT_TRUE(fs::exists(curves));
  write("bad/metrics.jsonl", "{\"step\":1,\"loss\":2}\n{\"loss\":\n");
  try {
    train::read_run_metrics((dir_ / "bad").string(), "bad");
    ADD_FAILURE() << "a broken line was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(train::read_run_metrics((dir_ / "missing").string(), "missing"), Error);
  // A last line cut off mid-record (a run still writing, or killed): the records before it.
  fs::create_directories(dir_ / "cut");
  write("cut/metrics.jsonl", "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1.5}\n{\"step\":3,\"lo");
  train::RunMetrics cut = train::read_run_metrics((dir_ / "cut").string(), "cut");
  EXPECT_EQ((cut.series[{"train", "loss"}]), (std::vector<std::pair<int64_t, double>>{{1, 2.0}, {2, 1.5}}));
}

}  // namespace
}  // namespace mt::testing
