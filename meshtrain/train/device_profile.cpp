#include "meshtrain/train/device_profile.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

namespace mt::train {

void add_device_spans(trace::Recording& recording, const std::vector<DeviceSpan>& spans) {
  recording.threads.emplace_back(kDeviceTrack, "GPU (device time)");
  for (const DeviceSpan& d : spans) {
    trace::Event e;
    e.phase = 'X';
    e.name = d.name;
    e.category = std::string("gpu_") + d.kind;
    e.ts_us = d.start_us;
    e.dur_us = d.dur_us;
    e.tid = kDeviceTrack;
    std::string args;
    if (d.bytes > 0) args = trace::arg("bytes", d.bytes);
    if (d.graph) args += (args.empty() ? "" : ", ") + trace::arg("graph", double(d.graph));
    e.args = std::move(args);
    recording.events.push_back(std::move(e));
  }
}

DeviceProfile summarize_device(const trace::Recording& recording) {
  DeviceProfile p;
  for (const auto& [tid, name] : recording.threads) p.recorded = p.recorded || tid == kDeviceTrack;
  std::map<std::pair<std::string, std::string>, DeviceRow> rows;
  for (const trace::Event& e : recording.events) {
    if (e.phase != 'X' || e.tid != kDeviceTrack || e.category.rfind("gpu_", 0) != 0) continue;
    const std::string kind = e.category.substr(4);
    DeviceRow& r = rows[{kind, e.name}];
    r.name = e.name;
    r.kind = kind;
    ++r.calls;
    r.total_ms += e.dur_us / 1000;
    p.busy_ms += e.dur_us / 1000;
    (kind == "kernel" ? p.kernels : kind == "memcpy" ? p.copies : p.fills) += 1;
    if (e.args.find("\"graph\"") != std::string::npos) ++p.from_graphs;
  }
  for (auto& [key, row] : rows) p.rows.push_back(std::move(row));
  std::sort(p.rows.begin(), p.rows.end(), [](const DeviceRow& a, const DeviceRow& b) { return a.total_ms > b.total_ms; });
  return p;
}

std::string format_device_table(const DeviceProfile& p, double step_ms, size_t top) {
  if (!p.recorded) return "";
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line,
                "device (GPU time): busy %.1f ms of %.1f ms of steps (%.1f%%): %lld kernels, %lld copies, %lld fills, "
                "%lld run by graph replays\n",
                p.busy_ms, step_ms, step_ms > 0 ? 100.0 * p.busy_ms / step_ms : 0.0, (long long)p.kernels,
                (long long)p.copies, (long long)p.fills, (long long)p.from_graphs);
  out << line;
  std::snprintf(line, sizeof line, "%-7s %7s %10s %7s %10s  %s\n", "kind", "calls", "total ms", "% busy", "mean us",
                "name");
  out << line;
  for (size_t i = 0; i < p.rows.size() && i < top; ++i) {
    const DeviceRow& r = p.rows[i];
    std::string name = r.name.size() > 120 ? r.name.substr(0, 117) + "..." : r.name;
    std::snprintf(line, sizeof line, "%-7s %7lld %10.3f %7.2f %10.1f  %s\n", r.kind.c_str(), (long long)r.calls,
                  r.total_ms, p.busy_ms > 0 ? 100.0 * r.total_ms / p.busy_ms : 0.0,
                  r.calls ? 1000.0 * r.total_ms / double(r.calls) : 0.0, name.c_str());
    out << line;
  }
  if (p.rows.size() > top) out << "(" << p.rows.size() - top << " more in ops.json)\n";
  return out.str();
}

}  // namespace mt::train
