#pragma once
// The names under which the Trainer logs each step's host reads and uploads (core/host_reads.h):
// diagnostics of whether a step can be captured, kept in metrics.jsonl and the profile. The
// progress line and curves.svg leave them out: they are 0 on almost every step, and a
// loss-scaled f16 step reads its one value by design.
#include <string>

namespace mt::train {

inline constexpr const char* kHostReadsMetric = "host_reads";
inline constexpr const char* kHostUploadsMetric = "host_uploads";

inline bool is_host_transfer_counter(const std::string& name) {
  return name == kHostReadsMetric || name == kHostUploadsMetric;
}

}  // namespace mt::train
