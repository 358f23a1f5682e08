#pragma once
// Console progress line: step/total, loss, lr, tokens/s, MFU, elapsed and ETA. On a TTY it
// redraws in place with '\r'; otherwise (logs, CI) it prints a plain line now and then.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "meshtrain/train/metric_sink.h"

namespace mt::train {

struct ProgressOptions {
  std::ostream* out = nullptr;  // null: std::cout; must outlive the bar (its destructor calls finish())
  enum class Mode { automatic, tty, plain };
  // automatic: tty when `out` is std::cout / std::cerr and that fd is a terminal.
  Mode mode = Mode::automatic;
  // Plain mode prints a line every `print_every` steps, or (when 0) each time another
  // `print_every_percent` of the total is done; the first and last step always print.
  int64_t print_every = 0;
  double print_every_percent = 10;
  double min_redraw_seconds = 0.1;  // tty mode: redraws at most this often (last step always)
  std::string description = "train";
  int64_t start_step = 0;  // a resumed run's first step, so the ETA counts only new steps
  int bar_width = 20;
  std::function<double()> clock{};  // seconds; default steady_clock (tests inject a fake)
};

struct ProgressStats {
  std::optional<double> loss{};
  std::optional<double> lr{};
  std::optional<double> tokens_per_s{};
  std::optional<double> examples_per_s{};  // batches padded to their longest row: no fixed token count
  std::optional<double> mfu{};          // fraction of peak, shown as a percentage
  std::optional<double> peak_rss_gb{};  // shown as "mem 3.1 GB"
  std::optional<double> gpu_peak_gb{};  // shown as "GPU 12.3 GB"
  std::map<std::string, double> extra{};  // shown as "name value" after the known fields
};

class ProgressBar : public MetricSink {
 public:
  // total_steps <= 0: unknown total (no bar, percentage or ETA).
  explicit ProgressBar(int64_t total_steps, ProgressOptions options = {});
  ~ProgressBar() override;

  void update(int64_t step, const ProgressStats& stats);
  // A line of its own (eval results, checkpoints); on a TTY the bar is redrawn below it.
  void message(const std::string& line);
  // Ends the in-place line on a TTY; in plain mode prints the last update if it was skipped.
  void finish();

  // "train" records update the bar from loss, lr (or learning_rate), tokens_per_s, examples_per_s, mfu and
  // show other values as extras; other splits print as a message ("eval step 100: ...").
  void write(const ScalarRecord& record) override;
  void flush() override;

  bool tty() const { return tty_; }
  // The text of one progress line (no '\r' or newline), as update() would draw it now.
  std::string format_line(int64_t step, const ProgressStats& stats) const;

 private:
  void emit_locked(const std::string& line, bool final_line);

  std::mutex mu_;
  ProgressOptions options_;
  std::ostream* out_;
  int64_t total_;
  bool tty_ = false;
  double t0_ = 0;
  double last_draw_ = -1e300;
  int64_t last_printed_bucket_ = -1;
  bool drawn_ = false;          // tty: a bar is on screen without a newline
  bool at_end_ = false;         // the bar shows the last step
  bool finished_ = false;
  std::string last_line_;       // the latest update's line
  bool last_line_printed_ = true;
};

}  // namespace mt::train
