// The memory a host copy may take (train/available_memory.h): MemAvailable capped by the
// process's memory cgroup, v2 and v1, a limit on an ancestor, page cache not counted as used,
// a container that sees its own cgroup at the top of /sys/fs/cgroup, unlimited and unreadable
// cgroups, and this machine's own reading.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "meshtrain/train/available_memory.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using train::available_memory_bytes;

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

class AvailableMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("mt_available_memory_" + std::to_string(getpid()));
    fs::remove_all(root_);
    write("proc/meminfo", "MemTotal:       33554432 kB\nMemFree:  1000 kB\nMemAvailable:   20971520 kB\n");
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const std::string& path, const std::string& text) {
    fs::create_directories((root_ / path).parent_path());
    std::ofstream(root_ / path) << text;
  }
  static std::string bytes(double gib) { return std::to_string(int64_t(gib * GiB)) + "\n"; }
  double available() const { return available_memory_bytes(root_.string()) / GiB; }
  fs::path root_;
};

TEST_F(AvailableMemory, CgroupV2LimitCapsMemAvailable) {
  write("proc/self/cgroup", "0::/job/step\n");
  write("sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
  write("sys/fs/cgroup/job/step/memory.max", bytes(8));
  write("sys/fs/cgroup/job/step/memory.current", bytes(3));
  write("sys/fs/cgroup/job/step/memory.stat", "anon 100\ninactive_file " + bytes(1));
  EXPECT_DOUBLE_EQ(available(), 6.0) << "8 GiB limit, 2 GiB working set (3 used, 1 reclaimable cache)";
  // A tighter limit on the parent wins; an unlimited leaf defers to it.
  write("sys/fs/cgroup/job/memory.max", bytes(5));
  write("sys/fs/cgroup/job/memory.current", bytes(4));
  EXPECT_DOUBLE_EQ(available(), 1.0);
  write("sys/fs/cgroup/job/step/memory.max", "max\n");
  EXPECT_DOUBLE_EQ(available(), 1.0);
  // No limit anywhere: MemAvailable (20 GiB).
  write("sys/fs/cgroup/job/memory.max", "max\n");
  EXPECT_DOUBLE_EQ(available(), 20.0);
  // Over the limit already: nothing to spare.
  write("sys/fs/cgroup/job/step/memory.max", bytes(2));
  EXPECT_DOUBLE_EQ(available(), 0.0);
}

TEST_F(AvailableMemory, CgroupV1AndAContainersOwnView) {
  write("proc/self/cgroup", "5:devices:/\n4:cpu,memory:/docker/abc\n0::/\n");
  write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", bytes(4));
  write("sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", bytes(1.5));
  write("sys/fs/cgroup/memory/docker/abc/memory.stat", "cache 1\ntotal_inactive_file " + bytes(0.5));
  EXPECT_DOUBLE_EQ(available(), 3.0);
  // Inside the container the host's path is absent: the top of the hierarchy is its own cgroup.
  fs::remove_all(root_ / "sys/fs/cgroup/memory/docker");
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", bytes(2));
  write("sys/fs/cgroup/memory/memory.usage_in_bytes", bytes(1));
  EXPECT_DOUBLE_EQ(available(), 1.0);
  // v1's "no limit" is a number near 2^63.
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_DOUBLE_EQ(available(), 20.0);
}

TEST_F(AvailableMemory, UnreadableFilesFallBack) {
  EXPECT_DOUBLE_EQ(available(), 20.0) << "no /proc/self/cgroup: MemAvailable";
  write("proc/self/cgroup", "0::/a\n");
  write("sys/fs/cgroup/cgroup.controllers", "memory\n");
  write("sys/fs/cgroup/a/memory.max", "garbage\n");
  write("sys/fs/cgroup/a/memory.current", bytes(1));
  EXPECT_DOUBLE_EQ(available(), 20.0) << "an unreadable limit is no limit";
  fs::remove(root_ / "proc/meminfo");
  EXPECT_DOUBLE_EQ(available(), 0.0) << "without MemAvailable nothing is assumed free";
}

double mem_available_now() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return 0;
}

TEST(AvailableMemoryHere, ThisMachinesReadingIsPositiveAndAtMostMemAvailable) {
  const double before = mem_available_now();
  const double here = available_memory_bytes();
  const double after = mem_available_now();
  std::cout << "  available here: " << here / GiB << " GiB (MemAvailable " << before / GiB << " GiB)\n";
  EXPECT_GT(here, 0);
  // MemAvailable moves between the reads: at most it, give or take what other processes did.
  EXPECT_LE(here, std::max(before, after) + 0.5 * GiB);
}

}  // namespace
}  // namespace mt::testing
