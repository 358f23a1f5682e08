#pragma once
// The GPU part of --profile: the device's own timings of its kernels, copies and fills
// (DeviceRuntime::stop_device_trace) as a track of the trace and as a table of where the
// device's time went — by kernel name and count, so a cast or copy kernel left in a bf16 step
// shows, and with its busy share of the profiled steps (the rest is the device waiting for the
// host: launches, reads, the data loader).
#include <string>
#include <vector>

#include "meshtrain/core/device.h"
#include "meshtrain/core/trace.h"

namespace mt::train {

// The trace's thread id for the device track.
constexpr int kDeviceTrack = 900;

// Appends `spans` to `recording` as complete events on the device track (categories
// "gpu_kernel", "gpu_memcpy", "gpu_memset"; args: bytes, graph).
void add_device_spans(trace::Recording& recording, const std::vector<DeviceSpan>& spans);

struct DeviceRow {
  std::string name;
  std::string kind;  // "kernel", "memcpy", "memset"
  int64_t calls = 0;
  double total_ms = 0;
};
struct DeviceProfile {
  bool recorded = false;  // the recording has a device track
  double busy_ms = 0;     // summed device time
  int64_t kernels = 0, copies = 0, fills = 0;
  int64_t from_graphs = 0;  // spans that replayed graphs ran
  std::vector<DeviceRow> rows;  // by total time, longest first
};
DeviceProfile summarize_device(const trace::Recording& recording);
// "" when nothing was recorded; else the busy share of `step_ms` and the longest `top` rows.
std::string format_device_table(const DeviceProfile& profile, double step_ms, size_t top = 30);

}  // namespace mt::train
