#pragma once
// metrics.jsonl: one JSON object per line, {"step": 10, "split": "train", "loss": 2.31, ...},
// flushed per line so a killed run keeps everything it logged.
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "meshtrain/train/metric_sink.h"

namespace mt::train {

struct JsonlLoggerOptions {
  // Keep the existing lines and add after them (a resumed run); false truncates the file.
  bool append = true;
  // When resuming from a checkpoint at this step, drop lines with a larger step: they were
  // logged after the checkpoint by the interrupted run and are about to be redone.
  std::optional<int64_t> resume_step{};
};

class JsonlLogger : public MetricSink {
 public:
  // Creates parent directories. An unterminated last line (a kill mid-write) is dropped
  // before appending. Throws mt::Error on I/O failure or an unparsable kept line.
  explicit JsonlLogger(const std::string& path, JsonlLoggerOptions options = {});
  ~JsonlLogger() override;
  JsonlLogger(const JsonlLogger&) = delete;
  JsonlLogger& operator=(const JsonlLogger&) = delete;

  // Non-finite values are written as null (JSON has no NaN). A value named "step" or
  // "split" is an error.
  void log(int64_t step, const std::string& split, const std::map<std::string, double>& values);
  void write(const ScalarRecord& record) override { log(record.step, record.split, record.values); }
  void flush() override;

  const std::string& path() const { return path_; }

 private:
  std::mutex mu_;
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mt::train
