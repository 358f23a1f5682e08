// CUDA graphs (backend/cuda/step_graph.h), the primitive a captured training step is built on:
// a captured chain of ops (matmul, bias, tanh, a reduction, temporaries freed inside) replays
// to the eager result, bit for bit, on new inputs written in place between replays; dropout
// whose key folds a device step in last draws each replay's own mask; an upload, a read or a
// wait inside a capture is refused, naming it, and the stream works eagerly afterwards; another
// thread's uploads never join a capture, and its launches during one are an error.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <iostream>
#include <set>
#include <thread>
#include <vector>

#include "meshtrain/meshtrain.h"
#include "tests/support/gpu.h"

#if MT_WITH_CUDA
#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/step_graph.h"
#endif

namespace mt::testing {
namespace {

#if MT_WITH_CUDA
double max_abs_difference(const Array& a, const Array& b) {
  const std::vector<float> x = a.to_floats(), y = b.to_floats();
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, double(std::abs(x[i] - y[i])));
  return worst;
}

TEST(GpuGraph, ReplaysEqualEagerOnNewInputsWrittenInPlace) {
  MT_REQUIRE_GPU();
  DeviceScope scope(Device::cuda(0));
  Array x = random_normal(RngKey{1, 0}, {64, 96});  // the static input
  const Array w = random_normal(RngKey{2, 0}, {96, 80}), b = random_normal(RngKey{3, 0}, {80});
  auto f = [&] {
    const Array h = tanh(add(matmul(x, w), b));  // temporaries: freed inside the graph
    return std::make_pair(h, sum(mul(h, h)));
  };
  f();  // warm-up: cuBLAS handles and workspaces exist before the capture
  std::pair<Array, Array> out;
  std::unique_ptr<cuda::StepGraph> graph = cuda::StepGraph::capture([&] { out = f(); });
  std::cout << "  captured " << graph->nodes() << " nodes, keeping " << graph->kept_bytes() << " bytes\n";
  EXPECT_GT(graph->nodes(), 3u);
  double worst = 0;
  for (uint64_t k = 0; k < 4; ++k) {
    const std::vector<float> values = random_normal(RngKey{10 + k, 0}, {64, 96}, DType::f32).to_floats();
    x.write_from_host(values.data());  // in place: the graph reads this address
    graph->replay();
    const auto [h, s] = f();  // eager, after the replay on the same stream
    worst = std::max({worst, max_abs_difference(out.first, h), max_abs_difference(out.second, s)});
  }
  std::cout << "  [max err] 4 replays on new inputs vs eager: " << worst << "\n";
  EXPECT_EQ(worst, 0.0);
}

TEST(GpuGraph, DropoutKeyedByADeviceStepDrawsEachReplaysMask) {
  MT_REQUIRE_GPU();
  DeviceScope scope(Device::cuda(0));
  const Array x = random_normal(RngKey{4, 0}, {33, 70});
  Array step = Array::scalar(0, DType::i64, Device::cuda(0));
  const RngKey root = RngKey{5, 6}.fold_in(2);
  dropout(x, 0.3, root.folding_last(step), true);
  Array out;
  auto graph = cuda::StepGraph::capture([&] { out = dropout(x, 0.3, root.folding_last(step), true); });
  std::vector<std::vector<float>> masks;
  for (int64_t s = 1; s <= 3; ++s) {
    step.write_from_host(&s);
    graph->replay();
    EXPECT_EQ(max_abs_difference(out, dropout(x, 0.3, root.fold_in(uint64_t(s)), true)), 0.0) << "step " << s;
    masks.push_back(out.to_floats());
  }
  EXPECT_NE(masks[0], masks[1]);
  EXPECT_NE(masks[1], masks[2]);
}

TEST(GpuGraph, HostTrafficInsideACaptureIsRefusedAndTheStreamStaysUsable) {
  MT_REQUIRE_GPU();
  DeviceScope scope(Device::cuda(0));
  const Array x = random_normal(RngKey{7, 0}, {16, 16});
  add(x, x);
  auto refused = [&](const std::function<void()>& inside, const std::string& named) {
    try {
      cuda::StepGraph::capture(inside);
      ADD_FAILURE() << "a capture holding " << named << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("[cuda graphs]"), std::string::npos) << what;
      EXPECT_NE(what.find(named), std::string::npos) << what;
    }
    EXPECT_FALSE(cuda::capturing_on_this_thread());
    // Eager work runs after a capture given up.
    EXPECT_EQ(max_abs_difference(add(x, x), mul(x, 2.0)), 0.0);
  };
  refused([&] { Array::from_vector(std::vector<float>{1, 2, 3}, {3}); }, "an upload");
  refused([&] { add(x, x).to_floats(); }, "a read to the host");
  refused([&] { cuda_runtime().synchronize(); }, "a wait for the stream");
}

// Another thread uploading (a data loader) while the step is captured: none of its
// allocations, copies or frees joins the graph, every capture holds the same nodes, and every
// upload lands intact. (When a thread checked for a capture, released the check, and then
// enqueued, an upload that lost the race with the capture's start became a node of the graph,
// which then copied a reused pinned-ring slot into freed memory on every replay.)
TEST(GpuGraph, AnotherThreadsUploadsNeverJoinACapture) {
  MT_REQUIRE_GPU();
  DeviceScope scope(Device::cuda(0));
  Array x = random_normal(RngKey{8, 0}, {64, 64});
  auto f = [&] { return sum(mul(add(x, x), x)); };
  f();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> uploads{0}, wrong{0};
  std::thread loader([&] {
    DeviceScope on(Device::cuda(0));
    for (int64_t k = 0; !stop.load(); ++k) {
      std::vector<int64_t> ids(512);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = k * 1000 + int64_t(i);
      const Array a = Array::from_vector(ids, {512});  // an upload from this thread
      if (a.to_ints() != ids) ++wrong;                  // and a read back
      ++uploads;
    }
  });
  std::set<size_t> node_counts;
  Array out;
  for (int round = 0; round < 200; ++round) {
    std::unique_ptr<cuda::StepGraph> graph = cuda::StepGraph::capture([&] { out = f(); });
    node_counts.insert(graph->nodes());
    graph->replay();
    EXPECT_EQ(out.to_floats(), f().to_floats()) << "round " << round;
  }
  stop = true;
  loader.join();
  std::cout << "  200 captures beside " << uploads.load() << " uploads from another thread: node counts";
  for (size_t n : node_counts) std::cout << " " << n;
  std::cout << ", " << wrong.load() << " uploads read back wrong\n";
  EXPECT_EQ(node_counts.size(), 1u) << "another thread's work joined a capture";
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(uploads.load(), 0);
}

// A kernel another thread launches while the training thread captures would be recorded into
// the graph and replayed at every step. Work that allocates, copies or frees waits for the
// capture to end (above); a launch into existing memory asks for the stream, which then refuses,
// naming the cause. The graph holds only the capturing thread's nodes and replays as before,
// and after the capture the other thread has the stream again.
TEST(GpuGraph, AnotherThreadsLaunchDuringACaptureIsAnErrorNotANode) {
  MT_REQUIRE_GPU();
  DeviceScope scope(Device::cuda(0));
  Array x = random_normal(RngKey{9, 0}, {64, 64});
  auto f = [&] { return sum(mul(x, x)); };
  Array out;
  const size_t alone = cuda::StepGraph::capture([&] { out = f(); })->nodes();
  std::string during, after;
  std::unique_ptr<cuda::StepGraph> graph = cuda::StepGraph::capture([&] {
    out = f();
    std::thread other([&] {
      try {
        (void)cuda::stream();  // what every kernel launch asks first
      } catch (const Error& e) {
        during = e.what();
      }
    });
    other.join();
  });
  std::thread later([&] {
    try {
      (void)cuda::stream();
    } catch (const Error& e) {
      after = e.what();
    }
  });
  later.join();
  EXPECT_NE(during.find("[cuda graphs] a thread other than the one capturing"), std::string::npos)
      << "another thread got the stream during a capture: '" << during << "'";
  EXPECT_EQ(after, "") << "the stream stayed refused after the capture";
  EXPECT_EQ(graph->nodes(), alone);
  graph->replay();
  EXPECT_EQ(out.to_floats(), f().to_floats());
}
#endif

}  // namespace
}  // namespace mt::testing
