#include "meshtrain/train/available_memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

namespace mt::train {

namespace {

namespace fs = std::filesystem;

constexpr double kUnlimited = std::numeric_limits<double>::infinity();

// A file's first number; "max" (cgroup v2's no limit) and v1's near-2^63 "no limit" are
// unlimited; nullopt when the file is absent or holds no number.
std::optional<double> read_number(const fs::path& file) {
  std::ifstream in(file);
  std::string word;
  if (!(in >> word)) return std::nullopt;
  if (word == "max") return kUnlimited;
  try {
    size_t used = 0;
    const double v = std::stod(word, &used);
    if (used != word.size()) return std::nullopt;
    return v >= 0x1p62 ? kUnlimited : v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The value of `key` in a "key value" file (memory.stat), 0 when absent.
double stat_value(const fs::path& file, const std::string& key) {
  std::ifstream in(file);
  std::string k;
  double v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

double mem_available(const std::string& root) {
  std::ifstream in(root + "/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return 0;
}

// The headroom of one cgroup directory, or unlimited.
double headroom(const fs::path& dir, bool v2) {
  const std::optional<double> limit = read_number(dir / (v2 ? "memory.max" : "memory.limit_in_bytes"));
  const std::optional<double> usage = read_number(dir / (v2 ? "memory.current" : "memory.usage_in_bytes"));
  if (!limit || !usage || *limit == kUnlimited) return kUnlimited;
  // The working set: page cache not recently used is reclaimed before the limit bites.
  const double inactive = stat_value(dir / "memory.stat", v2 ? "inactive_file" : "total_inactive_file");
  return std::max(0.0, *limit - std::max(0.0, *usage - inactive));
}

// The smallest headroom from `dir` up to `top` (limits are inherited from ancestors).
double headroom_up_to(fs::path dir, const fs::path& top, bool v2) {
  double least = kUnlimited;
  while (true) {
    least = std::min(least, headroom(dir, v2));
    if (dir == top || !dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
    if (dir.string().size() < top.string().size()) break;
  }
  return least;
}

// This process's memory cgroup headroom from /proc/self/cgroup: the v2 line "0::/path" or the
// v1 line "N:memory:/path" (or with other controllers, comma-joined). Inside a container the
// path is often the host's while /sys/fs/cgroup shows the container's own cgroup at its top:
// then the top is read.
double cgroup_headroom(const std::string& root) {
  std::ifstream in(root + "/proc/self/cgroup");
  std::string line;
  double least = kUnlimited;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    const bool v2 = controllers.empty();
    std::stringstream list(controllers);
    bool memory = false;
    for (std::string c; std::getline(list, c, ',');) memory = memory || c == "memory";
    if (!v2 && !memory) continue;
    const fs::path top = fs::path(root + (v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory"));
    std::error_code ec;  // an unreadable tree is no limit, not an error
    if (v2 && !fs::exists(top / "cgroup.controllers", ec)) continue;  // a hybrid host's empty v2 tree
    const fs::path own = top / fs::path(path).relative_path();
    least = std::min(least, fs::is_directory(own, ec) ? headroom_up_to(own, top, v2) : headroom(top, v2));
  }
  return least;
}

}  // namespace

double available_memory_bytes(const std::string& root) {
  const double available = mem_available(root);
  return std::min(available, cgroup_headroom(root));
}

}  // namespace mt::train
