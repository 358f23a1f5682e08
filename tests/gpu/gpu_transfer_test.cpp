// Host-to-device copies through the pinned ring (backend/cuda/pinned_staging): many copies in
// flight at once, wrapping a small ring several times, each from the same host buffer
// rewritten right after the call, all land intact; copies larger than the ring's quarter are
// left to the caller; and arrays made on the GPU from host data (how batches arrive) equal
// their source.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "meshtrain/core/array.h"
#include "tests/support/gpu.h"

#if MT_WITH_CUDA
#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/pinned_staging.h"
#endif

namespace mt::testing {
namespace {

#if MT_WITH_CUDA
TEST(GpuTransfer, PinnedRingCopiesLandIntactWhileTheSourceIsReused) {
  MT_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  cuda::PinnedStaging ring(size_t(1) << 20);  // 1 MiB: 300 copies of 100 KB wrap it ~30 times
  const size_t bytes = 100 * 1000;
  const int copies = 300;
  std::vector<Array> targets;
  std::vector<unsigned char> source(bytes);
  int staged = 0;
  for (int c = 0; c < copies; ++c) {
    targets.push_back(Array::empty({int64_t(bytes)}, DType::boolean, gpu));
    for (size_t i = 0; i < bytes; ++i) source[i] = static_cast<unsigned char>((i * 7 + size_t(c) * 13) & 1);
    if (ring.copy(targets.back().raw(), source.data(), bytes, cuda::stream())) {
      ++staged;
    } else {  // the ring is full of queued copies: the caller copies itself, as device_runtime does
      cuda::check(cudaMemcpyAsync(targets.back().raw(), source.data(), bytes, cudaMemcpyHostToDevice, cuda::stream()),
                  "pageable copy");
    }
  }
  EXPECT_GT(staged, copies / 10);
  EXPECT_FALSE(ring.copy(targets.back().raw(), source.data(), (size_t(1) << 18) + 1, cuda::stream()));
  int64_t bad = 0;
  for (int c = 0; c < copies; ++c) {
    const Array back = targets[size_t(c)].to(Device::cpu());
    const auto* v = static_cast<const unsigned char*>(back.raw());
    for (size_t i = 0; i < bytes; ++i) bad += v[i] != ((i * 7 + size_t(c) * 13) & 1);
  }
  EXPECT_EQ(bad, 0);
  std::cout << "  [max err] pinned ring: " << copies << " copies of " << bytes << " bytes (" << staged
            << " through the 1 MiB ring), " << bad << " wrong bytes\n";
}
#endif

TEST(GpuTransfer, ArraysFromHostDataEqualTheirSource) {
  MT_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(16 * 1024), int64_t(5) << 20}) {  // the last: pageable
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = (i * 2654435761LL) % 50257;
    std::vector<Array> on_gpu;
    for (int r = 0; r < 8; ++r) {
      ids[0] = r;
      on_gpu.push_back(Array::from_vector(ids, {n}).to(gpu));
    }
    for (int r = 0; r < 8; ++r) {
      const Array back = on_gpu[size_t(r)].to(Device::cpu());
      ids[0] = r;
      EXPECT_EQ(std::memcmp(back.raw(), ids.data(), size_t(n) * sizeof(int64_t)), 0) << "n=" << n << " r=" << r;
    }
  }
}

}  // namespace
}  // namespace mt::testing
