#pragma once
// Where a run's memory is, sampled each step for metrics.jsonl, the progress line and
// curves.svg: this process's resident memory now and at its peak, the bytes the host arrays
// hold now and at their peak (the caching allocator's count: RSS minus these is the allocator's
// cache, the libraries' own memory and the program), and on a GPU the device bytes held by
// arrays, reserved by the pool and the peak in use.
#include <optional>
#include <string>

namespace mt::train {

struct MemoryUsage {
  double rss_gb = 0;       // resident set now
  double peak_rss_gb = 0;  // the largest resident set so far (getrusage's ru_maxrss)
  double host_allocated_gb = 0;  // held by host arrays now
  double host_peak_gb = 0;       // the most host arrays have held at once
  std::optional<double> gpu_allocated_gb, gpu_reserved_gb, gpu_peak_gb;  // on a GPU only
};

// This process's usage (the current device's, for the GPU fields).
MemoryUsage memory_usage();
// Resident bytes now (/proc/self/statm), and the most so far (getrusage's ru_maxrss; the kernel
// updates it lazily, so callers take the larger of the two).
double resident_bytes();
double peak_resident_bytes();
// Whether a logged metric is one of the memory figures above (rss_gb, host_peak_gb, gpu_*).
bool is_memory_metric(const std::string& name);
// Whether it is a peak (drawn solid in the memory panel) rather than a current value.
bool is_peak_memory_metric(const std::string& name);

}  // namespace mt::train
