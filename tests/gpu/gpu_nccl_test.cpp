// The NCCL communicator on the GPU. One rank: every collective (f32, bf16, i64, bool; empty,
// small, odd and ~1M elements; in place and not) on device memory gives exactly what the
// host communicator gives on the same bytes, asynchronously ordered before later kernels.
// Two processes: on a machine with one GPU they share it, so they get no NCCL communicator and
// stage through the host (the same reason on both ranks); with two or more GPUs they reduce
// device memory through NCCL.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "meshtrain/core/array.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/distributed/local_communicator.h"
#include "meshtrain/distributed/nccl_communicator.h"
#include "tests/support/cli_run.h"
#include "tests/support/gpu.h"

namespace mt::testing {
namespace {

using dist::Communicator;
using dist::ReduceOp;

const Device kGpu = Device::cuda(0);

// A host array of n elements of `dtype` with distinct, valid bytes (bool: 0/1).
Array pattern(DType dtype, int64_t n, int salt) {
  Array a = Array::empty({n}, dtype, Device::cpu());
  auto* bytes = static_cast<unsigned char*>(a.raw());
  const size_t size = dtype_size(dtype);
  for (int64_t i = 0; i < n; ++i) {
    for (size_t b = 0; b < size; ++b) {
      unsigned v = unsigned(i * 131 + b * 17 + salt * 7);
      if (dtype == DType::boolean) v &= 1;
      if ((dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f32) && b + 1 == size) v &= 0x3f;  // finite
      bytes[size_t(i) * size + b] = static_cast<unsigned char>(v);
    }
  }
  return a;
}

bool same_bytes(const Array& device, const Array& host) {
  const Array back = device.to(Device::cpu());
  return back.nbytes() == host.nbytes() && std::memcmp(back.raw(), host.raw(), host.nbytes()) == 0;
}

std::shared_ptr<Communicator> one_rank_nccl(dist::LocalCommunicator& host) {
  std::string why;
  std::shared_ptr<Communicator> nccl = dist::make_nccl_communicator(host, kGpu, &why);
  EXPECT_NE(nccl, nullptr) << "no NCCL communicator: " << why;
  return nccl;
}

TEST(GpuNccl, OneRankCollectivesEqualTheHostCommunicator) {
  MT_REQUIRE_GPU();
  dist::LocalCommunicator host("one");
  auto nccl = one_rank_nccl(host);
  ASSERT_NE(nccl, nullptr);
  EXPECT_EQ(nccl->size(), 1);
  EXPECT_EQ(nccl->device_communicator(kGpu), nccl.get());
  int checked = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::i64, DType::boolean}) {
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1 << 20) + 5}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " n=" + std::to_string(n));
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        Array h = pattern(dtype, n, 1), d = h.to(kGpu);
        host.all_reduce(h.raw(), n, dtype, op);
        nccl->all_reduce(d.raw(), n, dtype, op);
        EXPECT_TRUE(same_bytes(d, h)) << "all_reduce " << dist::reduce_op_name(op);
        Array hs = pattern(dtype, n, 2), ds = hs.to(kGpu);
        Array hr = Array::zeros({n}, dtype, Device::cpu()), dr = Array::zeros({n}, dtype, kGpu);
        host.reduce_scatter(hs.raw(), hr.raw(), n, dtype, op);
        nccl->reduce_scatter(ds.raw(), dr.raw(), n, dtype, op);
        EXPECT_TRUE(same_bytes(dr, hr)) << "reduce_scatter";
        nccl->reduce_scatter(ds.raw(), ds.raw(), n, dtype, op);  // in place
        EXPECT_TRUE(same_bytes(ds, hr)) << "reduce_scatter in place";
      }
      Array h = pattern(dtype, n, 3), d = h.to(kGpu);
      Array out = Array::zeros({n}, dtype, kGpu);
      nccl->all_gather(d.raw(), out.raw(), n, dtype);
      EXPECT_TRUE(same_bytes(out, h)) << "all_gather";
      nccl->all_gather(out.raw(), out.raw(), n, dtype);  // in place: send = recv + rank*count
      EXPECT_TRUE(same_bytes(out, h)) << "all_gather in place";
      Array a2a = Array::zeros({n}, dtype, kGpu);
      nccl->all_to_all(d.raw(), a2a.raw(), n, dtype);
      EXPECT_TRUE(same_bytes(a2a, h)) << "all_to_all";
      nccl->all_to_all(d.raw(), d.raw(), n, dtype);
      EXPECT_TRUE(same_bytes(d, h)) << "all_to_all in place";
      nccl->broadcast(d.raw(), n, dtype, 0);
      EXPECT_TRUE(same_bytes(d, h)) << "broadcast";
      ++checked;
    }
  }
  nccl->barrier();
  EXPECT_EQ(checked, 16);
  EXPECT_EQ(nccl->stats().all_reduce.calls, 32);
  std::cout << "  [max err] one-rank NCCL vs host communicator: 0 (bytes equal, " << checked
            << " dtype/size cases, every collective)\n";
}

// The handle orders later work after the collective without blocking the host: a copy
// enqueued on the compute stream after wait() reads the gathered buffer, never the zeros
// that were there before (the collective runs on NCCL's own stream).
TEST(GpuNccl, WaitOrdersTheComputeStreamAfterTheCollective) {
  MT_REQUIRE_GPU();
  dist::LocalCommunicator host("one");
  auto nccl = one_rank_nccl(host);
  ASSERT_NE(nccl, nullptr);
  const int64_t n = int64_t(1) << 26;  // 256 MiB: the copy takes long enough to be overtaken
  for (int round = 0; round < 3; ++round) {
    const Array x = Array::full({n}, 1.5 + round, DType::f32, kGpu);
    Array out = Array::zeros({n}, DType::f32, kGpu);
    dist::CommHandle h = nccl->all_gather_async(x.raw(), out.raw(), n, DType::f32);
    h.wait();
    const Array back = out.to(Device::cpu());
    const float* v = back.data<float>();
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += v[i] != float(1.5 + round);
    EXPECT_EQ(bad, 0) << "round " << round;
    synchronize(kGpu);
    EXPECT_TRUE(h.done());
  }
}

// Run under mpirun by the test below: world() has 2 ranks.
TEST(GpuNccl, TwoRanksInsideMpirun) {
  MT_REQUIRE_GPU();
  if (!std::getenv("MT_NCCL_TEST_CHILD")) GTEST_SKIP() << "runs under mpirun (ProcessesOnTheGpusOfOneHost)";
  Communicator& w = dist::world();
  ASSERT_EQ(w.size(), 2);
  const int gpus = cuda_runtime().device_count();
  const Device mine = Device::cuda(local_gpu_index(gpus));
  Communicator* dc = w.device_communicator(mine);
  const std::string status = w.device_communicator_status();
  std::cout << "  rank " << w.rank() << " on " << mine.str() << ": " << status << "\n";
  if (gpus == 1) {
    EXPECT_EQ(dc, nullptr);
    EXPECT_NE(status.find("ranks 0 and 1 share GPU"), std::string::npos) << status;
    return;
  }
  ASSERT_NE(dc, nullptr) << status;
  std::vector<float> values(1000, float(w.rank() + 1));
  Array x = Array::from_vector(values, {1000}).to(mine);
  dc->all_reduce(x.raw(), 1000, DType::f32, ReduceOp::sum);
  const Array back = x.to(Device::cpu());
  EXPECT_EQ(back.data<float>()[999], 3.0f);
}

TEST(GpuNccl, ProcessesOnTheGpusOfOneHost) {
  MT_REQUIRE_GPU();
  if (std::getenv("MT_NCCL_TEST_CHILD")) GTEST_SKIP() << "the child run";
  const char* ld = std::getenv("LD_LIBRARY_PATH");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command = std::string(MT_MPIRUN) + " -np 2 -x MT_NCCL_TEST_CHILD=1" +
                              (ld ? std::string(" -x LD_LIBRARY_PATH") : std::string()) + " " + self +
                              " --gtest_color=no --gtest_filter=GpuNccl.TwoRanksInsideMpirun";
  const CliRun run = run_command(command, "mpirun -np 2 gpu_nccl_test (TwoRanksInsideMpirun)");
  std::cout << run.out;
  EXPECT_EQ(run.code, 0);
  EXPECT_NE(run.out.find("[  PASSED  ] 1 test"), std::string::npos);
}

}  // namespace
}  // namespace mt::testing
