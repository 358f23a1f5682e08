// Communicator and Mesh under mpirun -np {1,2,4}: every collective for f32/bf16/i64 (and
// f16/bool spot checks) at 0, 1, odd and ~1M elements, sums and maxes, async overlap, mesh
// sub-communicators, stats counters, and identical error messages on every rank.
// Every value is exactly representable in its dtype, so results must match exactly.
#include <gtest/gtest.h>

#include "tests/support/op_check.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "meshtrain/core/element.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/distributed/mesh.h"

namespace mt::dist {
namespace {

// The largest crosses the 4 MiB chunks of the MPI all_reduce and reduce_scatter for every dtype.
const std::vector<int64_t> kCounts = {0, 1, 7, (1 << 20) + 5};

// Rank r's element i of buffer `salt`: small multiples of 0.5 for floats (exact in bf16, and
// sums over 4 ranks stay exact), values beyond 2^53 for i64 (a double round trip would show).
template <class T>
T value(int r, int64_t i, int salt = 0) {
  const int64_t base = (i * 7 + r * 3 + salt * 5) % 17 - 8;
  if constexpr (std::is_same_v<T, int64_t>) return base + int64_t(r + 1) * (int64_t(1) << 55);
  else return from_double<T>(double(base) + 0.5 * r);
}
template <class T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, int64_t>) return double(v);  // comparisons below use exact ints
  else return to_double(v);
}

// Number of mismatching elements; rank 0 prints a summary line like the other test helpers.
template <class T>
int64_t mismatches(const std::vector<T>& got, const std::vector<T>& want, const std::string& label) {
  int64_t bad = 0;
  double max_err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = std::memcmp(&got[i], &want[i], sizeof(T)) == 0;
    if (!same) {
      ++bad;
      max_err = std::max(max_err, std::fabs(as_double(got[i]) - as_double(want[i])));
    }
  }
  if (world().rank() == 0)
    std::printf("  %-44s n=%-8zu max error %g (%lld mismatches)\n", label.c_str(), got.size(), max_err,
                (long long)bad);
  return bad;
}

template <class T>
std::string label(const char* op, int64_t count, const char* extra = "") {
  return detail::concat(op, extra, " ", dtype_name(dtype_of<T>()), " x", count, " np", world().size());
}

template <class T>
class TypedCollectives : public ::testing::Test {};
using CollectiveTypes = ::testing::Types<float, bf16, int64_t>;
TYPED_TEST_SUITE(TypedCollectives, CollectiveTypes);

TYPED_TEST(TypedCollectives, AllReduceSumAndMax) {
  using T = TypeParam;
  Communicator& w = world();
  const int n = w.size();
  for (int64_t count : kCounts) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      std::vector<T> data(static_cast<size_t>(count)), want(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        data[size_t(i)] = value<T>(w.rank(), i);
        if constexpr (std::is_same_v<T, int64_t>) {
          int64_t acc = op == ReduceOp::sum ? 0 : value<T>(0, i);
          for (int r = 0; r < n; ++r) acc = op == ReduceOp::sum ? acc + value<T>(r, i) : std::max(acc, value<T>(r, i));
          want[size_t(i)] = acc;
        } else {
          double acc = op == ReduceOp::sum ? 0 : -1e30;
          for (int r = 0; r < n; ++r)
            acc = op == ReduceOp::sum ? acc + to_double(value<T>(r, i)) : std::max(acc, to_double(value<T>(r, i)));
          want[size_t(i)] = from_double<T>(acc);
        }
      }
      w.all_reduce(data.data(), count, dtype_of<T>(), op);
      EXPECT_EQ(mismatches(data, want, label<T>("all_reduce", count, op == ReduceOp::sum ? "(sum)" : "(max)")), 0);
    }
  }
}

TYPED_TEST(TypedCollectives, AllGatherIsRankMajor) {
  using T = TypeParam;
  Communicator& w = world();
  const int n = w.size();
  for (int64_t count : kCounts) {
    if (count > 1000) count /= n;  // ~1M elements gathered in total
    std::vector<T> send(static_cast<size_t>(count)), recv(size_t(count * n)), want(size_t(count * n));
    for (int64_t i = 0; i < count; ++i) send[size_t(i)] = value<T>(w.rank(), i);
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < count; ++i) want[size_t(r * count + i)] = value<T>(r, i);
    w.all_gather(send.data(), recv.data(), count, dtype_of<T>());
    EXPECT_EQ(mismatches(recv, want, label<T>("all_gather", count)), 0);

    // In place: this rank's block already sits at its slot of the output.
    std::vector<T> inplace(size_t(count * n));
    std::copy(send.begin(), send.end(), inplace.begin() + w.rank() * count);
    w.all_gather(inplace.data() + w.rank() * count, inplace.data(), count, dtype_of<T>());
    EXPECT_EQ(mismatches(inplace, want, label<T>("all_gather", count, "(in place)")), 0);
  }
}

TYPED_TEST(TypedCollectives, ReduceScatterSumAndMax) {
  using T = TypeParam;
  Communicator& w = world();
  const int n = w.size();
  for (int64_t count : kCounts) {
    if (count > 1000) count /= n;
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      // Block j of rank r's input is value(r, i, salt=j); rank `rank` receives the reduction of block `rank`.
      std::vector<T> send(size_t(count * n)), recv(static_cast<size_t>(count)), want(static_cast<size_t>(count));
      for (int j = 0; j < n; ++j)
        for (int64_t i = 0; i < count; ++i) send[size_t(j * count + i)] = value<T>(w.rank(), i, j);
      for (int64_t i = 0; i < count; ++i) {
        double acc = op == ReduceOp::sum ? 0 : -1e300;
        int64_t iacc = op == ReduceOp::sum ? 0 : value<int64_t>(0, i, w.rank());
        for (int r = 0; r < n; ++r) {
          const T v = value<T>(r, i, w.rank());
          if constexpr (std::is_same_v<T, int64_t>) iacc = op == ReduceOp::sum ? iacc + v : std::max(iacc, v);
          else acc = op == ReduceOp::sum ? acc + to_double(v) : std::max(acc, to_double(v));
        }
        if constexpr (std::is_same_v<T, int64_t>) want[size_t(i)] = iacc;
        else want[size_t(i)] = from_double<T>(acc);
      }
      w.reduce_scatter(send.data(), recv.data(), count, dtype_of<T>(), op);
      EXPECT_EQ(mismatches(recv, want, label<T>("reduce_scatter", count, op == ReduceOp::sum ? "(sum)" : "(max)")), 0);
      // In place: the result lands in the first block, over input the MPI rounds read.
      std::vector<T> inplace = send;
      w.reduce_scatter(inplace.data(), inplace.data(), count, dtype_of<T>(), op);
      inplace.resize(size_t(count));
      EXPECT_EQ(mismatches(inplace, want, label<T>("reduce_scatter", count, "(in place)")), 0);
    }
  }
}

TYPED_TEST(TypedCollectives, AllToAllTransposesBlocks) {
  using T = TypeParam;
  Communicator& w = world();
  const int n = w.size();
  for (int64_t count : kCounts) {
    if (count > 1000) count /= n;
    // Block j of rank r's input goes to rank j; recv block i came from rank i.
    std::vector<T> send(size_t(count * n)), recv(size_t(count * n)), want(size_t(count * n));
    for (int j = 0; j < n; ++j)
      for (int64_t i = 0; i < count; ++i) {
        send[size_t(j * count + i)] = value<T>(w.rank(), i, j);
        want[size_t(j * count + i)] = value<T>(j, i, w.rank());
      }
    w.all_to_all(send.data(), recv.data(), count, dtype_of<T>());
    EXPECT_EQ(mismatches(recv, want, label<T>("all_to_all", count)), 0);
  }
}

TYPED_TEST(TypedCollectives, BroadcastFromEveryRoot) {
  using T = TypeParam;
  Communicator& w = world();
  for (int64_t count : kCounts) {
    for (int root = 0; root < w.size(); ++root) {
      std::vector<T> data(static_cast<size_t>(count)), want(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        data[size_t(i)] = value<T>(w.rank(), i);
        want[size_t(i)] = value<T>(root, i);
      }
      w.broadcast(data.data(), count, dtype_of<T>(), root);
      const std::string extra = "(root " + std::to_string(root) + ")";
      EXPECT_EQ(mismatches(data, want, label<T>("broadcast", count, extra.c_str())), 0);
    }
  }
}

// bf16 sums accumulate in f32: 256 + 1 + 1 + 1 rounds once (to 260 on 4 ranks); a bf16
// accumulator would round after every addition and stay at 256.
TEST(Collectives, HalfPrecisionSumsAccumulateInF32) {
  Communicator& w = world();
  const float mine = w.rank() == 0 ? 256.0f : 1.0f;
  const float exact = 256.0f + float(w.size() - 1);
  std::vector<bf16> b(5, f32_to_bf16(mine));
  w.all_reduce(b.data(), 5, DType::bf16, ReduceOp::sum);
  for (bf16 v : b) EXPECT_EQ(v.bits, f32_to_bf16(exact).bits) << bf16_to_f32(v);
  std::vector<bf16> blocks(size_t(w.size()) * 3, f32_to_bf16(mine)), out(3);
  w.reduce_scatter(blocks.data(), out.data(), 3, DType::bf16, ReduceOp::sum);
  for (bf16 v : out) EXPECT_EQ(v.bits, f32_to_bf16(exact).bits) << bf16_to_f32(v);

  std::vector<f16> h(9);
  for (int i = 0; i < 9; ++i) h[size_t(i)] = f32_to_f16(0.25f * float(i) + float(w.rank()));
  w.all_reduce(h.data(), 9, DType::f16, ReduceOp::sum);
  const float rank_sum = float(w.size() * (w.size() - 1) / 2);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(f16_to_f32(h[size_t(i)]), 0.25f * float(i) * float(w.size()) + rank_sum);
}

TEST(Collectives, BoolAndI32Reductions) {
  Communicator& w = world();
  // Element 0: true on rank 0 only; element 1: false everywhere; element 2: true everywhere.
  bool flags[3] = {w.rank() == 0, false, true};
  w.all_reduce(flags, 3, DType::boolean, ReduceOp::sum);  // logical or
  EXPECT_TRUE(flags[0]);
  EXPECT_FALSE(flags[1]);
  EXPECT_TRUE(flags[2]);
  int32_t vals[2] = {w.rank() + 1, -w.rank()};
  w.all_reduce(vals, 2, DType::i32, ReduceOp::max);
  EXPECT_EQ(vals[0], w.size());
  EXPECT_EQ(vals[1], 0);
}

TEST(Async, TwoAllReducesWaitedInReverseOrder) {
  Communicator& w = world();
  const int64_t na = 300001, nb = 17;
  std::vector<float> a(size_t(na), float(w.rank() + 1)), b(size_t(nb), 2.0f * float(w.rank()));
  CommHandle ha = w.all_reduce_async(a.data(), na, DType::f32, ReduceOp::sum);
  CommHandle hb = w.all_reduce_async(b.data(), nb, DType::f32, ReduceOp::max);
  EXPECT_TRUE(ha.valid());
  EXPECT_TRUE(hb.valid());
  // Compute while the collectives run: the communication thread does the MPI work.
  double busy = 0;
  for (int i = 0; i < 200000; ++i) busy += std::sqrt(double(i));
  EXPECT_GT(busy, 0);
  hb.wait();
  ha.wait();
  EXPECT_TRUE(ha.done());
  EXPECT_TRUE(hb.done());
  const float sum = float(w.size() * (w.size() + 1) / 2);
  int64_t bad = 0;
  for (float v : a) bad += v != sum;
  for (float v : b) bad += v != 2.0f * float(w.size() - 1);
  EXPECT_EQ(bad, 0);
  ha.wait();  // waiting twice is fine
}

TEST(Async, PollingAndImplicitWaitOnLastHandle) {
  Communicator& w = world();
  std::vector<int64_t> x(1000, w.rank());
  std::vector<int64_t> gathered(x.size() * size_t(w.size()));
  CommHandle h = w.all_gather_async(x.data(), gathered.data(), 1000, DType::i64);
  CommHandle copy = h;  // copies share the operation
  while (!copy.done()) {
  }
  EXPECT_NO_THROW(h.wait());
  for (int r = 0; r < w.size(); ++r) EXPECT_EQ(gathered[size_t(r) * 1000 + 999], r);

  std::vector<float> y(12345, 1.0f);
  { CommHandle dropped = w.all_reduce_async(y.data(), 12345, DType::f32, ReduceOp::sum); }  // waits here
  int64_t bad = 0;
  for (float v : y) bad += v != float(w.size());
  EXPECT_EQ(bad, 0);

  CommHandle empty;
  EXPECT_FALSE(empty.valid());
  try {
    empty.wait();
    ADD_FAILURE() << "wait() on an empty handle must throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[comm] wait() on an empty CommHandle (default-constructed, not returned by a collective)");
  }
}

// Expected world ranks of this rank's group along `axis`, ordered by the axis coordinate.
std::vector<int64_t> expected_peers(const Mesh& mesh, const std::string& axis) {
  const auto& names = mesh.axis_names();
  std::vector<int64_t> peers;
  for (int c = 0; c < mesh.axis_size(axis); ++c) {
    int64_t r = 0;
    for (const auto& name : names) r = r * mesh.axis_size(name) + (name == axis ? c : mesh.axis_index(name));
    peers.push_back(r);
  }
  return peers;
}

void check_mesh(const Mesh& mesh) {
  Communicator& w = world();
  SCOPED_TRACE(mesh.str());
  EXPECT_EQ(mesh.size(), w.size());
  EXPECT_EQ(&mesh.comm(), &w);
  // Coordinates are row-major in the world rank.
  int64_t linear = 0;
  for (const auto& name : mesh.axis_names()) linear = linear * mesh.axis_size(name) + mesh.axis_index(name);
  EXPECT_EQ(linear, w.rank());
  for (const auto& axis : mesh.axis_names()) {
    Communicator& c = mesh.axis_comm(axis);
    EXPECT_EQ(c.size(), mesh.axis_size(axis)) << axis;
    EXPECT_EQ(c.rank(), mesh.axis_index(axis)) << axis;
    EXPECT_EQ(c.name(), axis);
    std::vector<int64_t> me = {w.rank()}, peers(size_t(c.size()));
    c.all_gather(me.data(), peers.data(), 1, DType::i64);
    EXPECT_EQ(peers, expected_peers(mesh, axis)) << axis;
  }
}

TEST(Mesh, AxisCommunicatorsHaveTheRightPeers) {
  const int n = world().size();
  for (int model = 1; model <= n; ++model) {
    if (n % model) continue;
    check_mesh(Mesh::from_model_shards(model));
    check_mesh(Mesh::from_string("data=-1,model=" + std::to_string(model)));
  }
  if (n == 4) {
    const Mesh mesh = Mesh::from_string("data=2,model=2");
    const int r = world().rank();
    EXPECT_EQ(mesh.coords(), (std::vector<int>{r / 2, r % 2}));
    // Rows share a data coordinate (model peers), columns a model coordinate (data peers).
    EXPECT_EQ(expected_peers(mesh, "model"), (std::vector<int64_t>{2 * (r / 2), 2 * (r / 2) + 1}));
    EXPECT_EQ(expected_peers(mesh, "data"), (std::vector<int64_t>{r % 2, r % 2 + 2}));
    check_mesh(mesh);
    check_mesh(Mesh::from_string("x=2,y=1,z=2"));
    // Collectives over one axis reduce only within the group.
    std::vector<float> v = {float(r)};
    mesh.axis_comm("model").all_reduce(v.data(), 1, DType::f32, ReduceOp::sum);
    EXPECT_EQ(v[0], float(4 * (r / 2) + 1));
    v = {float(r)};
    mesh.axis_comm("data").all_reduce(v.data(), 1, DType::f32, ReduceOp::sum);
    EXPECT_EQ(v[0], float(2 * (r % 2) + 2));
  }
}

TEST(Mesh, CopiesShareCommunicators) {
  const Mesh a = Mesh::from_model_shards(1);
  const Mesh b = a;
  EXPECT_EQ(&a.axis_comm("data"), &b.axis_comm("data"));
  EXPECT_EQ(&a.axis_comm("model"), &b.axis_comm("model"));
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, Mesh::from_string("data=-1,model=1"));
  EXPECT_NE(a, Mesh::single());
}

TEST(Stats, CountCallsAndBytesPerCommunicator) {
  Communicator& w = world();
  const int n = w.size();
  w.reset_stats();
  EXPECT_EQ(w.stats().total_calls(), 0);
  std::vector<float> f(10 * size_t(n)), f_out(10 * size_t(n));
  std::vector<int64_t> g(5 * size_t(n)), g_out(5 * size_t(n));
  w.all_reduce(f.data(), 10, DType::f32, ReduceOp::sum);
  w.all_gather(g.data(), g_out.data(), 5, DType::i64);
  w.reduce_scatter(f.data(), f_out.data(), 3, DType::f32, ReduceOp::sum);
  w.all_to_all(f.data(), f_out.data(), 2, DType::f32);
  w.broadcast(g.data(), 4, DType::i64, 0);
  w.all_reduce(f.data(), 0, DType::f32, ReduceOp::max);  // empty collectives still count
  w.barrier();
  const CommStats s = w.stats();
  EXPECT_EQ(s.all_reduce.calls, 2);
  EXPECT_EQ(s.all_reduce.bytes, 40);
  EXPECT_EQ(s.all_gather.calls, 1);
  EXPECT_EQ(s.all_gather.bytes, 40);
  EXPECT_EQ(s.reduce_scatter.bytes, 12 * n);
  EXPECT_EQ(s.all_to_all.bytes, 8 * n);
  EXPECT_EQ(s.broadcast.bytes, 32);
  EXPECT_EQ(s.barrier.calls, 1);
  EXPECT_EQ(s[CollectiveKind::barrier].bytes, 0);
  EXPECT_EQ(s.total_calls(), 7);
  if (n == 1) {
    EXPECT_EQ(s.str(), "all_reduce: 2 calls, 40 B; all_gather: 1 call, 40 B; reduce_scatter: 1 call, 12 B; "
                       "all_to_all: 1 call, 8 B; broadcast: 1 call, 32 B; barrier: 1 call");
  }
  // Axis communicators count separately from the world.
  const Mesh mesh = Mesh::from_model_shards(n);
  mesh.axis_comm("model").all_reduce(f.data(), 10, DType::f32, ReduceOp::sum);
  EXPECT_EQ(mesh.axis_comm("model").stats().all_reduce.calls, 1);
  EXPECT_EQ(mesh.axis_comm("data").stats().total_calls(), 0);
  EXPECT_EQ(w.stats().all_reduce.calls, 2);
  w.reset_stats();
  EXPECT_EQ(w.stats().str(), "no collectives");
}

using mt::testing::error_of;

TEST(Errors, SameMessageOnEveryRank) {
  Communicator& w = world();
  const int n = w.size();
  const std::string ns = std::to_string(n);
  std::vector<float> buf(8);
  EXPECT_EQ(error_of([&] { w.all_reduce(buf.data(), -3, DType::f32, ReduceOp::sum); }),
            "[comm] all_reduce on 'world': negative count -3");
  EXPECT_EQ(error_of([&] { w.all_gather(nullptr, buf.data(), 2, DType::bf16); }),
            "[comm] all_gather on 'world': null send buffer for 2 bf16 elements");
  EXPECT_EQ(error_of([&] { w.reduce_scatter(buf.data(), nullptr, 2, DType::f32, ReduceOp::sum); }),
            "[comm] reduce_scatter on 'world': null recv buffer for 2 f32 elements");
  EXPECT_EQ(error_of([&] { w.broadcast(buf.data(), 8, DType::f32, n); }),
            "[comm] broadcast on 'world' (size " + ns + "): root " + ns + " out of range [0, " + ns + ")");
  EXPECT_EQ(error_of([&] { w.all_to_all(buf.data(), buf.data(), int64_t(1) << 31, DType::f32); }),
            "[comm] all_to_all on 'world': 2147483648 x " + ns +
                " elements exceed the limit of 2147483647 per collective; split the buffer");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=3,model=5"); }),
            "[mesh] mesh 'data=3,model=5' has 15 devices but the world has " + ns + (n == 1 ? " rank" : " ranks") +
                " (launch with mpirun -np 15)");
  EXPECT_EQ(error_of([] { Mesh::from_model_shards(1).axis_comm("tensor"); }),
            "[mesh] unknown axis 'tensor'; mesh 'data=" + ns + ",model=1' has axes data, model");
  EXPECT_EQ(error_of([&] { Mesh::from_model_shards(n + 1); }),
            "[mesh] --model-shards " + std::to_string(n + 1) + " does not divide the " + ns + (n == 1 ? " process" : " processes") +
                " of this run: launch a multiple of " + std::to_string(n + 1) + ", e.g. mpirun -np " +
                std::to_string(n + 1) + " meshtrain ...");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=2,model"); }),
            "[mesh] malformed mesh 'data=2,model': expected axis=size items separated by commas, e.g. "
            "'data=2,model=2'; got 'model'");
  // Every rank threw and issued no collective: the world still works.
  std::vector<int32_t> one = {1};
  w.all_reduce(one.data(), 1, DType::i32, ReduceOp::sum);
  EXPECT_EQ(one[0], n);
}

TEST(World, MatchesTheLaunch) {
  Communicator& w = world();
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(launched_by_mpi(), size != nullptr);
  EXPECT_EQ(w.size(), size ? std::atoi(size) : 1);
  EXPECT_GE(w.rank(), 0);
  EXPECT_LT(w.rank(), w.size());
  EXPECT_EQ(w.name(), "world");
  EXPECT_EQ(&w, &world());
}

}  // namespace
}  // namespace mt::dist

namespace mt::dist {
namespace {

// The device communicator is decided together, once per communicator, by the first ask
// whatever device it names: on a machine without a usable GPU every rank gets none and the
// same reason, from one collective (a rank deciding alone would leave the others waiting in
// it) that stats() does not count; ranks on mixed devices (one asking for a GPU, one on the
// CPU) decide in the same collective, and later asks of either kind never communicate.
TEST(World, DeviceCommunicatorIsDecidedByAllRanks) {
  Communicator& w = world();
  const int64_t calls_before = w.stats().total_calls();
  if (w.size() == 1) {
    EXPECT_EQ(w.device_communicator(Device::cpu()), nullptr);
    EXPECT_EQ(w.device_communicator_status(), "one rank: collectives move nothing");
    return;
  }
  if (cuda_runtime().device_count() > 0) GTEST_SKIP() << "a GPU is visible: tests/gpu covers NCCL";
  EXPECT_EQ(w.device_communicator_status(), "not yet asked for");
  EXPECT_EQ(w.device_communicator(Device::cpu()), nullptr);  // decides: this process has no GPU
  const std::string why = w.device_communicator_status();
  if (w.rank() == 0) std::cout << "  device communicator: none (" << why << ")\n";
  // Rank 0's reason, named by rank, or the build's.
  EXPECT_TRUE(why.rfind("rank 0: ", 0) == 0 || why == "meshtrain was built without CUDA") << why;
  EXPECT_EQ(w.device_communicator(Device::cuda(0)), nullptr);  // decided once, no second collective
  EXPECT_EQ(w.device_communicator_status(), why);
  EXPECT_EQ(w.stats().total_calls(), calls_before);  // the decision is not counted

  std::shared_ptr<Communicator> mixed = w.split(0, w.rank(), "mixed");
  const bool gpu_rank = w.rank() % 2 == 0;
  EXPECT_EQ(mixed->device_communicator(gpu_rank ? Device::cuda(0) : Device::cpu()), nullptr);
  EXPECT_EQ(mixed->device_communicator(gpu_rank ? Device::cpu() : Device::cuda(0)), nullptr);  // no collective
  const std::string status = mixed->device_communicator_status();
  EXPECT_TRUE(status.rfind("rank 0: ", 0) == 0 || status == "meshtrain was built without CUDA") << status;
  // Both communicators still pair their collectives after the decisions.
  std::vector<int32_t> one = {1};
  w.all_reduce(one.data(), 1, DType::i32, ReduceOp::sum);
  EXPECT_EQ(one[0], w.size());
  mixed->all_reduce(one.data(), 1, DType::i32, ReduceOp::sum);
  EXPECT_EQ(one[0], w.size() * w.size());
}

}  // namespace
}  // namespace mt::dist
