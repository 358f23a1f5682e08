#include "meshtrain/train/progress.h"

#include "meshtrain/train/host_transfer_counters.h"
#include "meshtrain/train/memory_usage.h"

#include <cstdlib>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

namespace mt::train {

namespace {

double steady_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string printf_str(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// 42s, 5m12s, 1h02m03s.
std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = int64_t(std::llround(seconds));
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof(buf), "%lldh%02lldm%02llds", (long long)(s / 3600), (long long)(s / 60 % 60), (long long)(s % 60));
  else if (s >= 60) std::snprintf(buf, sizeof(buf), "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else std::snprintf(buf, sizeof(buf), "%llds", (long long)s);
  return buf;
}

// 950, 12.3k, 4.56M.
std::string format_rate(double v) {
  if (std::fabs(v) >= 1e9) return printf_str("%.2fG", v / 1e9);
  if (std::fabs(v) >= 1e6) return printf_str("%.2fM", v / 1e6);
  if (std::fabs(v) >= 1e4) return printf_str("%.1fk", v / 1e3);
  return printf_str("%.0f", v);
}

// 0.6931, 1.250e-05; whole numbers (a loss scale, a count) as they are: 65536, 3.
std::string format_value(double v) {
  if (v == std::trunc(v) && std::fabs(v) < 1e15) return printf_str("%.0f", v);
  if (std::fabs(v) < 1e-3 || std::fabs(v) >= 1e5) return printf_str("%.3e", v);
  return printf_str("%.4f", v);
}

}  // namespace

ProgressBar::ProgressBar(int64_t total_steps, ProgressOptions options)
    : options_(std::move(options)), out_(options_.out ? options_.out : &std::cout), total_(total_steps) {
  if (!options_.clock) options_.clock = steady_seconds;
  switch (options_.mode) {
    case ProgressOptions::Mode::tty: tty_ = true; break;
    case ProgressOptions::Mode::plain: tty_ = false; break;
    case ProgressOptions::Mode::automatic:
      // An arbitrary ostream has no file descriptor; only the standard streams can be a TTY.
      if (out_ == &std::cout) tty_ = isatty(STDOUT_FILENO);
      else if (out_ == &std::cerr || out_ == &std::clog) tty_ = isatty(STDERR_FILENO);
      // OpenMPI hands each rank a pseudo-terminal whatever mpirun's own output is (often a
      // file or a pipe), so under mpirun the bar prints plain lines.
      if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE")) tty_ = false;
      break;
  }
  t0_ = options_.clock();
}

ProgressBar::~ProgressBar() { finish(); }

std::string ProgressBar::format_line(int64_t step, const ProgressStats& stats) const {
  std::string line = options_.description.empty() ? "" : options_.description + " ";
  if (total_ > 0) {
    double frac = std::clamp(double(step) / double(total_), 0.0, 1.0);
    int width = std::max(options_.bar_width, 0);
    int filled = int(frac * width);
    line += std::to_string(step) + "/" + std::to_string(total_);
    if (width > 0) line += " [" + std::string(size_t(filled), '#') + std::string(size_t(width - filled), '-') + "]";
    line += printf_str(" %3.0f%%", 100.0 * frac);
  } else {
    line += "step " + std::to_string(step);
  }
  if (stats.loss) line += " | loss " + printf_str("%.4f", *stats.loss);
  if (stats.lr) line += " | lr " + printf_str("%.2e", *stats.lr);
  if (stats.tokens_per_s) line += " | " + format_rate(*stats.tokens_per_s) + " tok/s";
  if (stats.examples_per_s) line += " | " + format_rate(*stats.examples_per_s) + " ex/s";
  if (stats.mfu) line += " | MFU " + printf_str("%.1f%%", 100.0 * *stats.mfu);
  if (stats.peak_rss_gb) line += " | mem " + printf_str("%.2f GB", *stats.peak_rss_gb);
  if (stats.gpu_peak_gb) line += " | GPU " + printf_str("%.2f GB", *stats.gpu_peak_gb);
  for (const auto& [name, v] : stats.extra) line += " | " + name + " " + format_value(v);
  double elapsed = options_.clock() - t0_;
  line += " | " + format_duration(elapsed);
  if (total_ > 0) {
    int64_t done = step - options_.start_step;
    double eta = done > 0 ? elapsed / double(done) * double(std::max<int64_t>(total_ - step, 0)) : NAN;
    line += " ETA " + format_duration(eta);
  }
  return line;
}

void ProgressBar::emit_locked(const std::string& line, bool final_line) {
  if (tty_) {
    // \x1b[K clears what a longer previous line left on the right.
    *out_ << '\r' << line << "\x1b[K";
    drawn_ = true;
    if (final_line) {
      *out_ << '\n';
      drawn_ = false;
    }
  } else {
    *out_ << line << '\n';
  }
  out_->flush();
  last_line_printed_ = true;
}

void ProgressBar::update(int64_t step, const ProgressStats& stats) {
  std::lock_guard<std::mutex> lock(mu_);
  finished_ = false;
  last_line_ = format_line(step, stats);
  last_line_printed_ = false;
  bool last = total_ > 0 && step >= total_;
  at_end_ = last;
  if (tty_) {
    double now = options_.clock();
    if (!last && now - last_draw_ < options_.min_redraw_seconds) return;
    last_draw_ = now;
    emit_locked(last_line_, false);
    return;
  }
  // Plain mode: print when the step enters a new bucket (every N steps or every p%).
  int64_t bucket;
  if (options_.print_every > 0) bucket = step / options_.print_every;
  else if (total_ > 0 && options_.print_every_percent > 0)
    bucket = int64_t(std::floor(100.0 * double(step) / double(total_) / options_.print_every_percent));
  else bucket = step;
  if (last_printed_bucket_ < 0 || bucket != last_printed_bucket_ || last) {
    last_printed_bucket_ = bucket;
    emit_locked(last_line_, false);
  }
}

void ProgressBar::message(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tty_ && drawn_ && at_end_) {
    // The finished bar stays where it is, once; what follows goes below it.
    *out_ << '\n' << line << '\n';
    drawn_ = false;
  } else if (tty_ && drawn_) {
    // Above the bar, which is drawn again below the line.
    *out_ << "\r\x1b[K" << line << '\n';
    *out_ << '\r' << last_line_ << "\x1b[K";
  } else {
    *out_ << line << '\n';
  }
  out_->flush();
}

void ProgressBar::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  if (!last_line_printed_ && !last_line_.empty()) emit_locked(last_line_, true);
  else if (tty_ && drawn_) {
    *out_ << '\n';
    drawn_ = false;
    out_->flush();
  }
}

void ProgressBar::write(const ScalarRecord& record) {
  if (record.split != "train") {
    std::string line = record.split + " step " + std::to_string(record.step) + ":";
    bool first = true;
    for (const auto& [name, v] : record.values) {
      line += std::string(first ? " " : " | ") + name + " " + format_value(v);
      first = false;
    }
    message(line);
    return;
  }
  ProgressStats stats;
  for (const auto& [name, v] : record.values) {
    if (name == "loss") stats.loss = v;
    else if (name == "lr" || name == "learning_rate") stats.lr = v;
    else if (name == "tokens_per_s") stats.tokens_per_s = v;
    else if (name == "examples_per_s") stats.examples_per_s = v;
    else if (name == "mfu") stats.mfu = v;
    else if (name == "model_flops_per_s") continue;  // the bar shows MFU instead
    else if (name == "peak_rss_gb") stats.peak_rss_gb = v;
    else if (name == "gpu_peak_gb") stats.gpu_peak_gb = v;
    else if (is_memory_metric(name)) continue;  // the others: metrics.jsonl and curves.svg
    else if (is_host_transfer_counter(name)) continue;  // metrics.jsonl only
    else stats.extra[name] = v;
  }
  update(record.step, stats);
}

void ProgressBar::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  out_->flush();
}

}  // namespace mt::train
