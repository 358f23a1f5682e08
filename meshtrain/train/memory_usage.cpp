#include "meshtrain/train/memory_usage.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "meshtrain/core/allocator.h"
#include "meshtrain/core/device.h"

namespace mt::train {

double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  double pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * double(sysconf(_SC_PAGESIZE));
}

double peak_resident_bytes() {
  rusage usage{};
  return getrusage(RUSAGE_SELF, &usage) == 0 ? double(usage.ru_maxrss) * 1024.0 : 0.0;  // KiB on Linux
}

MemoryUsage memory_usage() {
  constexpr double kGb = 1e9;
  MemoryUsage m;
  m.rss_gb = resident_bytes() / kGb;
  m.peak_rss_gb = std::max(peak_resident_bytes() / kGb, m.rss_gb);
  const AllocatorStats host = CachingAllocator::instance().stats();
  m.host_allocated_gb = double(host.bytes_in_use) / kGb;
  m.host_peak_gb = double(host.peak_bytes_in_use) / kGb;
  const Device d = current_device();
  if (d.is_cuda()) {
    const DeviceMemoryStats s = cuda_runtime().memory_stats(d.index);
    m.gpu_allocated_gb = double(s.bytes_in_use) / kGb;
    m.gpu_reserved_gb = double(s.bytes_reserved) / kGb;
    m.gpu_peak_gb = double(s.peak_bytes_in_use) / kGb;
  }
  return m;
}

bool is_memory_metric(const std::string& name) {
  return name == "rss_gb" || name == "host_allocated_gb" || name == "gpu_allocated_gb" || name == "gpu_reserved_gb" ||
         is_peak_memory_metric(name);
}

bool is_peak_memory_metric(const std::string& name) {
  return name == "peak_rss_gb" || name == "host_peak_gb" || name == "gpu_peak_gb";
}

}  // namespace mt::train
