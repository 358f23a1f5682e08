// The host-side rules of device collectives, checked without a GPU: which GPU "cuda" means
// in each process, when ranks may use NCCL, and how a stream-ordered handle (NCCL's) joins.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>

#include "meshtrain/core/device.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/comm_handle.h"
#include "meshtrain/distributed/nccl_communicator.h"
#include "tests/support/scoped_env.h"

namespace mt {
namespace {

using testing::ScopedEnv;

TEST(LocalGpuIndex, OneProcessPerGpuUnderALauncher) {
  ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", nullptr), mpich("MPI_LOCALRANKID", nullptr),
      slurm("SLURM_LOCALID", nullptr);
  EXPECT_EQ(local_gpu_index(4), 0);  // no launcher
  {
    ScopedEnv r("OMPI_COMM_WORLD_LOCAL_RANK", "3");
    EXPECT_EQ(local_gpu_index(4), 3);
    EXPECT_EQ(local_gpu_index(2), 1);  // more processes than GPUs: round-robin
    EXPECT_EQ(local_gpu_index(1), 0);
    EXPECT_EQ(local_gpu_index(0), 0);
  }
  {
    ScopedEnv r("MPI_LOCALRANKID", "5");
    EXPECT_EQ(local_gpu_index(8), 5);
  }
  {
    ScopedEnv r("SLURM_LOCALID", "x2");  // not a number: ignored
    EXPECT_EQ(local_gpu_index(8), 0);
  }
}

TEST(NcclEligibility, DistinctGpusOnly) {
  using dist::nccl_ineligibility;
  EXPECT_EQ(nccl_ineligibility({"a/GPU-01", "a/GPU-02", "b/GPU-01"}), "");
  EXPECT_EQ(nccl_ineligibility({"a/GPU-01", "a/GPU-02", "a/GPU-01"}),
            "ranks 0 and 2 share GPU a/GPU-01 (NCCL takes one process per GPU; their collectives go through host "
            "memory)");
  EXPECT_EQ(nccl_ineligibility({"a/GPU-01", "!cannot load libnccl.so.2"}), "rank 1: cannot load libnccl.so.2");
  EXPECT_EQ(nccl_ineligibility({"a/GPU-01", ""}), "rank 1: no GPU identity");
  // The first problem by rank is reported, so every rank reports the same one.
  EXPECT_EQ(nccl_ineligibility({"!MT_NCCL=0", "!MT_NCCL=0"}), "rank 0: MT_NCCL=0");
}

TEST(StreamOrderedHandle, JoinsOnceAtDoneOrWait) {
  int joins = 0;
  bool device_done = false;
  dist::CommHandle h = dist::CommHandle::stream_ordered(
      [&] {
        ++joins;
        return std::string();
      },
      [&] { return device_done; });
  EXPECT_FALSE(h.done());
  EXPECT_EQ(joins, 0);  // still running: not joined
  device_done = true;
  EXPECT_TRUE(h.done());  // the device finished: joined, so a result copied at the join is enqueued
  EXPECT_EQ(joins, 1);
  dist::CommHandle copy = h;
  h.wait();
  copy.wait();
  EXPECT_EQ(joins, 1);
}

TEST(StreamOrderedHandle, ErrorsRethrowAndTheLastCopyJoins) {
  dist::CommHandle failing = dist::CommHandle::stream_ordered([] { return std::string("[nccl] broken link"); },
                                                              [] { return false; });
  for (int i = 0; i < 2; ++i) {
    try {
      failing.wait();
      ADD_FAILURE() << "wait() must throw the join's error";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(), "[nccl] broken link");
    }
  }
  dist::CommHandle throwing =
      dist::CommHandle::stream_ordered([]() -> std::string { throw std::runtime_error("event lost"); }, nullptr);
  EXPECT_THROW(throwing.wait(), Error);
  int joins = 0;
  {
    dist::CommHandle dropped = dist::CommHandle::stream_ordered(
        [&] {
          ++joins;
          return std::string();
        },
        nullptr);
  }
  EXPECT_EQ(joins, 1);  // never waited: the last copy joined, so the buffers' later frees are ordered
}

}  // namespace
}  // namespace mt
