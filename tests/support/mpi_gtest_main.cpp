// gtest main of the SPMD tests (tests/spmd), run under mpirun: every rank runs every test.
// Rank 0 prints gtest's normal output; other ranks print only their failures, prefixed with
// "[rank r]". The failure flags are combined at the end, so every rank exits non-zero if any
// rank failed and rank 0 names the failing ranks.
// Tests must keep collectives matched across ranks even when a check fails: use EXPECT_*
// before a collective, not ASSERT_* (which returns early). A mismatch that still slips
// through is ended by the communication watchdog (MT_COMM_TIMEOUT_S), never a silent hang.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "meshtrain/distributed/communicator.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::printf("[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "unknown file",
                result.line_number(), result.message());
    std::fflush(stdout);
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::printf("[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(), info.name());
    std::fflush(stdout);
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  mt::dist::Communicator& world = mt::dist::world();
  const int rank = world.rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();

  int32_t failed = rc != 0;
  std::vector<int32_t> all(size_t(world.size()));
  world.all_gather(&failed, all.data(), 1, mt::DType::i32);
  std::string failing;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r]) failing += (failing.empty() ? "" : ", ") + std::to_string(r);
  if (rank == 0 && !failing.empty() && world.size() > 1) {
    std::printf("[spmd] tests failed on rank(s) %s of %d (failures of other ranks are printed with their rank)\n",
                failing.c_str(), world.size());
    std::fflush(stdout);
  }
  return failing.empty() ? 0 : 1;
}
