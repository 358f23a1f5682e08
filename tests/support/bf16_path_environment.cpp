// Linked into every test binary: the bf16 GEMM path a CTest registration asks for in
// MT_TEST_BF16_PATH (tests/CMakeLists.txt registers the bf16 tests once per path):
//   native   — oneDNN's own bf16 kernels; on a CPU without them every test is skipped, with
//              the reason, and CTest reports the entry "Skipped", never "Passed";
//   emulated — capped at AVX2 (MESHTRAIN_MAX_CPU_ISA=avx2), bf16 widened to f32; the binary
//              fails if the cap did not take, so this registration cannot pass on the wrong path.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "meshtrain/backend/cpu/cpu_features.h"

namespace {

class Bf16PathEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* asked = std::getenv("MT_TEST_BF16_PATH");
    if (!asked) return;
    const std::string path = asked, summary = mt::cpu::cpu_summary();
    std::cout << "[bf16 path] " << path << " asked; " << summary << std::endl;
    const bool native = mt::cpu::cpu_features().bf16_gemm_native;
    if (path == "native" && !native) {
      // gtest still counts the tests as passed after a skip here; CTest reads this marker
      // (SKIP_REGULAR_EXPRESSION) and reports the entry as skipped.
      std::cout << "[bf16 path] SKIPPED: no native bf16 on this CPU (" << summary << ")" << std::endl;
      GTEST_SKIP() << "no native bf16 on this CPU";
    }
    if (path == "emulated") {
      ASSERT_FALSE(native) << "the AVX2 cap did not take effect: " << summary;
    }
    ASSERT_TRUE(path == "native" || path == "emulated") << "MT_TEST_BF16_PATH=" << path << ": expected native or emulated";
  }
};

[[maybe_unused]] ::testing::Environment* const registered = ::testing::AddGlobalTestEnvironment(new Bf16PathEnvironment);

}  // namespace
