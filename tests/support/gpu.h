#pragma once
// GPU tests (tests/gpu, CTest label `gpu`): each starts with MT_REQUIRE_GPU(), which skips the
// test with a visible "[gpu] SKIPPED" line where no GPU is visible (or the build has no CUDA),
// so `ctest` on a CPU machine passes and says why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "meshtrain/core/device.h"

#define MT_REQUIRE_GPU()                                                                                  \
  do {                                                                                                    \
    if (::mt::cuda_runtime().device_count() == 0) {                                                       \
      std::cout << "[gpu] SKIPPED: no GPU visible (or meshtrain built without CUDA)\n";                   \
      GTEST_SKIP() << "[gpu] SKIPPED";                                                                    \
    }                                                                                                     \
  } while (0)

namespace mt::testing {
// ../shared/data, or $MT_DATA_DIR on a machine where the data was unpacked elsewhere (the GPU
// machine: scripts/gpu_pack.sh carries what the GPU tests read).
inline std::string gpu_data_dir() {
  const char* env = std::getenv("MT_DATA_DIR");
  return env && *env ? std::string(env) : std::string(MT_DATA_DIR);
}
}  // namespace mt::testing
