// The GPU part of --profile, from device spans as CUPTI reports them (made up here; the real
// ones are checked by tests/gpu/gpu_profile_test): the spans become a trace track, the table
// sums them by kind and name, longest first, counts what graph replays ran, and gives the
// device's busy share of the steps; a recording without a device track prints nothing.
#include <gtest/gtest.h>

#include <iostream>

#include "meshtrain/train/device_profile.h"

namespace mt::train {
namespace {

TEST(DeviceProfile, SpansBecomeATrackAndATableByName) {
  std::vector<DeviceSpan> spans;
  auto span = [&](const std::string& name, const char* kind, double start, double dur, double bytes, uint32_t graph) {
    DeviceSpan d;
    d.name = name, d.kind = kind, d.start_us = start, d.dur_us = dur, d.bytes = bytes, d.graph = graph;
    spans.push_back(d);
  };
  span("sm90_xmma_gemm_bf16bf16", "kernel", 0, 400, 0, 0);
  span("mt::cuda::cast_kernel<float, bf16>", "kernel", 410, 50, 0, 7);
  span("sm90_xmma_gemm_bf16bf16", "kernel", 470, 600, 0, 7);
  span("memcpy HtoD", "memcpy", 1100, 20, 4096, 0);
  span("memset", "memset", 1130, 5, 256, 7);
  trace::Recording recording;
  recording.threads.emplace_back(0, "compute");
  const DeviceProfile none = summarize_device(recording);
  EXPECT_FALSE(none.recorded);
  EXPECT_EQ(format_device_table(none, 10.0), "");

  add_device_spans(recording, spans);
  ASSERT_EQ(recording.events.size(), 5u);
  EXPECT_EQ(recording.events[1].category, "gpu_kernel");
  EXPECT_EQ(recording.events[1].tid, kDeviceTrack);
  EXPECT_NE(recording.events[1].args.find("\"graph\": 7"), std::string::npos) << recording.events[1].args;
  EXPECT_NE(recording.events[3].args.find("\"bytes\": 4096"), std::string::npos) << recording.events[3].args;
  EXPECT_EQ(recording.events[3].category, "gpu_memcpy");

  const DeviceProfile p = summarize_device(recording);
  EXPECT_TRUE(p.recorded);
  EXPECT_DOUBLE_EQ(p.busy_ms, 1.075);
  EXPECT_EQ(p.kernels, 3);
  EXPECT_EQ(p.copies, 1);
  EXPECT_EQ(p.fills, 1);
  EXPECT_EQ(p.from_graphs, 3);
  ASSERT_EQ(p.rows.size(), 4u);
  EXPECT_EQ(p.rows[0].name, "sm90_xmma_gemm_bf16bf16");
  EXPECT_EQ(p.rows[0].calls, 2);
  EXPECT_DOUBLE_EQ(p.rows[0].total_ms, 1.0);
  EXPECT_EQ(p.rows[1].name, "mt::cuda::cast_kernel<float, bf16>");

  const std::string table = format_device_table(p, 2.15, 2);
  std::cout << table;
  EXPECT_NE(table.find("busy 1.1 ms of 2.1 ms of steps (50.0%): 3 kernels, 1 copies, 1 fills, 3 run by graph replays"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("cast_kernel<float, bf16>"), std::string::npos);
  EXPECT_EQ(table.find("memcpy HtoD"), std::string::npos) << "only the top 2 rows";
  EXPECT_NE(table.find("(2 more in ops.json)"), std::string::npos);
}

}  // namespace
}  // namespace mt::train
