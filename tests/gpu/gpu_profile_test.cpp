// --profile on the GPU shows the device's own timings (train/device_profile.h): a GPT-2 run
// profiled over steps 5-7 (its graph captured by step 3; profiled steps are not captured)
// writes a device track of kernels (cuBLAS GEMMs among them) into
// trace.json and a device table into ops.json/ops.txt whose busy time fits in the profiled
// steps; with --cuda-graphs on the replayed steps' kernels are there too, marked with their
// graph, and eagerly none are.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "meshtrain/io/json.h"
#include "tests/support/cli_run.h"
#include "tests/support/gpu.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class GpuProfile : public TempDir {
 protected:
  json profiled(const std::string& graphs, const std::string& name) {
    const fs::path out = dir_ / name;
    const CliRun r = run_cli("pretrain --model gpt2 --data " + gpu_data_dir() +
                             "/text/tinyshakespeare.txt --seq-len 64 --per-device-batch-size 8 --steps 8 "
                             "--eval-fraction 0.005 --sample-every 0 --device cuda --profile 5:7 --cuda-graphs " +
                             graphs + " --output-dir " + out.string());
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out.find("no device track"), std::string::npos) << r.out;
    const json trace = io::read_json_file((out / "profile" / "trace.json").string());
    int64_t device_events = 0;
    for (const json& e : trace.at("traceEvents"))
      if (e.value("cat", "").rfind("gpu_", 0) == 0) ++device_events;
    EXPECT_GT(device_events, 0) << "no device spans in trace.json";
    const json ops = io::read_json_file((out / "profile" / "ops.json").string());
    std::cout << "  --cuda-graphs " << graphs << ": " << device_events << " device spans; "
              << ops.at("device").dump().substr(0, 300) << "\n";
    return ops;
  }
};

TEST_F(GpuProfile, TheDeviceTrackTimesKernelsAlsoInReplayedGraphs) {
  MT_REQUIRE_GPU();
  for (const std::string graphs : {"off", "on"}) {
    const json ops = profiled(graphs, "run_" + graphs);
    ASSERT_TRUE(ops.contains("device")) << ops.dump();
    const json& d = ops.at("device");
    EXPECT_GT(d.at("kernels").get<int64_t>(), 100);
    EXPECT_GT(d.at("busy_ms").get<double>(), 0);
    EXPECT_LE(d.at("busy_ms").get<double>(), ops.at("step_ms").get<double>() * 1.05)
        << "the device cannot be busy longer than the steps it ran in";
    bool gemm = false;
    for (const json& r : d.at("rows")) {
      std::string name = r.at("name");
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
      gemm = gemm || name.find("gemm") != std::string::npos;
    }
    EXPECT_TRUE(gemm) << "no GEMM kernel among the device rows";
    if (graphs == "on") {
      EXPECT_GT(d.at("from_graphs").get<int64_t>(), 100) << "the replayed steps' kernels are missing";
    } else {
      EXPECT_EQ(d.at("from_graphs").get<int64_t>(), 0);
    }
  }
}

}  // namespace
}  // namespace mt::testing
