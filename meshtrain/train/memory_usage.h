#pragma once
// Where a run's memory is, sampled each step for metrics.jsonl, the progress line and
// curves.svg: this process's resident memory now and at its peak, and on a GPU the device
// bytes held by arrays, reserved by the pool and the peak in use.
#include <optional>

namespace mt::train {

struct MemoryUsage {
  double rss_gb = 0;       // resident set now
  double peak_rss_gb = 0;  // the largest resident set so far (getrusage's ru_maxrss)
  std::optional<double> gpu_allocated_gb, gpu_reserved_gb, gpu_peak_gb;  // on a GPU only
};

// This process's usage (the current device's, for the GPU fields).
MemoryUsage memory_usage();
// Resident bytes now (/proc/self/statm).
double resident_bytes();

}  // namespace mt::train
