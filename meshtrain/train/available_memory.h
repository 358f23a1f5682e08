#pragma once
// How much more host memory this process may take: the kernel's MemAvailable, capped by the
// memory cgroup the process runs in (a container's or a batch job's limit). /proc/meminfo
// shows the whole machine's memory inside a container, so a copy sized by it alone can push
// a limited job over its limit and have it killed. Read by the checkpoint writer to decide
// whether a host copy of the state fits beside training.
#include <string>

namespace mt::train {

// Bytes this process can still allocate: min(MemAvailable, limit - working set) over the
// cgroup (v2: memory.max - (memory.current - inactive_file), walking up to the root of the
// visible hierarchy; v1: memory.limit_in_bytes - (memory.usage_in_bytes - total_inactive_file)).
// An unlimited or unreadable cgroup leaves MemAvailable; 0 when /proc/meminfo is unreadable.
// `root` prefixes /proc and /sys (tests point it at a made-up tree).
double available_memory_bytes(const std::string& root = "");

}  // namespace mt::train
