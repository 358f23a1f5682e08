#pragma once
// Where logged scalars go: metrics.jsonl, TensorBoard, the progress bar. AsyncMetricWriter
// resolves a step's values to plain doubles and hands each record to its sinks.
#include <cstdint>
#include <map>
#include <string>

namespace mt::train {

struct ScalarRecord {
  int64_t step = 0;
  std::string split = "train";  // "train" or "eval" (any name is kept as given)
  std::map<std::string, double> values{};
};

class MetricSink {
 public:
  virtual ~MetricSink() = default;
  virtual void write(const ScalarRecord& record) = 0;
  virtual void flush() {}
};

}  // namespace mt::train
