#pragma once
// The server's Prometheus metrics (GET /metrics, text exposition format 0.0.4): request
// counts by endpoint and status, latency and time-to-first-token histograms, and the
// engine's gauges and counters (queue depth, running sequences, KV-cache use, tokens,
// decode batch sizes) read at scrape time, and the process's resident memory and CPU GEMM plans.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/serve/engine.h"

namespace mt::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // "name_bucket{le=...} n" lines (cumulative), then _sum and _count.
  void render(std::string& out, const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class ServeMetrics {
 public:
  ServeMetrics();
  void count_request(const std::string& endpoint, int status);
  void observe_latency(double seconds);
  void observe_time_to_first_token(double seconds);
  std::string render(const EngineStats& engine) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  Histogram latency_, first_token_;
};

}  // namespace mt::serve
