// A small GPT (tests/support/tiny_gpt.h) trained for a few AdamW steps under data parallel,
// FSDP, tensor parallel and data x tensor meshes: every loss and every updated parameter
// equals the one-device run (dropout included, thanks to position-keyed randomness). Also counts the collectives of a
// tensor-parallel MLP and of an FSDP weight, so silent extra gathers and all-reduces are caught.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <optional>

#include "meshtrain/core/allocator.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/distributed/collective_ops.h"
#include "meshtrain/distributed/grad_reducer.h"
#include "meshtrain/distributed/mesh.h"
#include "meshtrain/distributed/sharded_random.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/meshtrain.h"
#include "tests/support/op_check.h"
#include "tests/support/tiny_gpt.h"

namespace mt::testing {
namespace {

using dist::Mesh;
using dist::PartitionSpec;

const TinyGptConfig kConfig{};
const int64_t kBatch = kConfig.batch, kTime = kConfig.time, kWidth = kConfig.width;

struct RunResult {
  std::vector<double> losses;
  Params params;  // gathered to host
};

RunResult train(const std::string& layout, const Mesh* mesh, int steps) {
  Params params = tiny_gpt_init(kConfig, layout, mesh);
  optim::Transform opt = tiny_gpt_optimizer();
  Params opt_state = opt.init(params);
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    Array ids = random_ints({kBatch, kTime}, 100, 0, kConfig.vocab);  // one batch, memorized
    Array labels = random_ints({kBatch, kTime}, 200, 0, kConfig.vocab);
    if (mesh && mesh->has_axis("data") && layout != "tp") {
      ids = dist::shard(ids, *mesh, PartitionSpec{"data", ""}, "ids");
      labels = dist::shard(labels, *mesh, PartitionSpec{"data", ""}, "labels");
    }
    auto [loss, grads] = value_and_grad([&](const Params& p) { return tiny_gpt_loss(kConfig, p, ids, labels, uint64_t(s)); })(params);
    for (const auto& [path, g] : grads) {
      const dist::Sharding* ps = dist::sharding_of(params[path]);
      const dist::Sharding* gs = dist::sharding_of(g);
      EXPECT_EQ(ps ? ps->spec : PartitionSpec{}, gs ? gs->spec : PartitionSpec{}) << layout << " grad layout of " << path;
    }
    params = optim::apply_updates(params, opt.update(grads, opt_state, params));
    r.losses.push_back(dist::to_host(loss).item());
  }
  for (const auto& [path, w] : params) {
    r.params.set(path, dist::to_host(w));
    // Optimizer state is laid out like its parameter.
    const dist::Sharding* ps = dist::sharding_of(w);
    const dist::Sharding* ms = dist::sharding_of(opt_state["mu." + path]);
    EXPECT_EQ(ps ? ps->spec : PartitionSpec{}, ms ? ms->spec : PartitionSpec{}) << layout << " state of " << path;
  }
  return r;
}

TEST(SpmdTrain, GptStepsMatchOneDevice) {
  const int n = dist::world().size();
  const RunResult ref = train("single", nullptr, 3);
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  struct Setup {
    std::string layout, mesh;
  };
  std::vector<Setup> setups{{"dp", "data=" + std::to_string(n)}, {"fsdp", "data=" + std::to_string(n)}};
  if (n <= 4) setups.push_back({"tp", "model=" + std::to_string(n)});
  if (n >= 4 && n % 2 == 0) setups.push_back({"dp_tp", "data=" + std::to_string(n / 2) + ",model=2"});
  for (const Setup& s : setups) {
    Mesh mesh = Mesh::from_string(s.mesh);
    RunResult got = train(s.layout, &mesh, 3);
    double loss_err = 0, param_err = 0;
    for (size_t i = 0; i < got.losses.size(); ++i) loss_err = std::max(loss_err, std::abs(got.losses[i] - ref.losses[i]));
    for (const auto& [path, w] : ref.params) {
      auto a = w.to_doubles(), b = got.params[path].to_doubles();
      for (size_t i = 0; i < a.size(); ++i) param_err = std::max(param_err, std::abs(a[i] - b[i]));
    }
    if (dist::world().rank() == 0)
      std::cout << "  [max err] " << s.layout << " on " << s.mesh << ": loss " << loss_err << ", params " << param_err
                << " (losses " << got.losses[0] << " -> " << got.losses.back() << ")\n";
    EXPECT_LE(loss_err, 2e-5) << s.layout;
    EXPECT_LE(param_err, 2e-5) << s.layout;
  }
}

TEST(SpmdTrain, TensorParallelMlpCommunicatesOncePerPass) {
  const int n = dist::world().size();
  Mesh mesh = Mesh::from_string("model=" + std::to_string(n));
  Array x = random_normal({kBatch, kTime, kWidth}, 1);
  Params p{{"x", x},
           {"fc", dist::shard(random_normal({kWidth, 4 * kWidth}, 2), mesh, PartitionSpec{"", "model"}, "fc")},
           {"proj", dist::shard(random_normal({4 * kWidth, kWidth}, 3), mesh, PartitionSpec{"model", ""}, "proj")}};
  dist::Communicator& comm = mesh.axis_comm("model");
  comm.reset_stats();
  dist::CommStats forward;
  auto f = [&](const Params& q) {
    Array y = matmul(gelu(matmul(q["x"], q["fc"])), q["proj"]);
    y = dist::with_sharding_constraint(y, mesh, PartitionSpec{});  // the row-parallel all-reduce
    forward = comm.stats();
    return sum(square(y));
  };
  auto [loss, grads] = value_and_grad(f)(p);
  dist::CommStats total = comm.stats();
  if (dist::world().rank() == 0)
    std::cout << "  forward: " << forward.str() << "\n  forward+backward: " << total.str() << "\n";
  const int expected = n > 1 ? 1 : 0;
  EXPECT_EQ(forward.all_reduce.calls, expected);
  EXPECT_EQ(forward.all_gather.calls + forward.reduce_scatter.calls + forward.all_to_all.calls, 0);
  // Backward: one all-reduce for the gradient of the replicated input of the column-parallel
  // layer; weight gradients stay sharded like their weights.
  EXPECT_EQ(total.all_gather.calls + total.reduce_scatter.calls + total.all_to_all.calls, 0);
  EXPECT_EQ(total.all_reduce.calls, 2 * expected);
  if (n > 1) {
    EXPECT_EQ(dist::sharding_of(grads["fc"])->spec, (PartitionSpec{"", "model"}));
  }
}

// FSDP: a weight split over data is gathered for the product with the data-split batch; its
// gradient comes back partial from each rank's rows and must be reduce-scattered into the
// weight's shards, never all-reduced whole (which sent twice the bytes and held the whole
// gradient on every rank).
TEST(SpmdTrain, FsdpWeightGradientIsReduceScatteredNotAllReduced) {
  const int n = dist::world().size();
  Mesh mesh = Mesh::from_string("data=" + std::to_string(n));
  const Array x_host = random_normal({2 * n, kTime, kWidth}, 31), w_host = random_normal({kWidth, 4 * n}, 32);
  Params p{{"w", dist::shard(w_host, mesh, PartitionSpec{"data", ""}, "w")}};
  const Array x = dist::shard(x_host, mesh, PartitionSpec{"data", "", ""}, "x");
  dist::Communicator& comm = mesh.axis_comm("data");
  comm.reset_stats();
  auto [loss, grads] = value_and_grad([&](const Params& q) { return sum(square(matmul(x, q["w"]))); })(p);
  const dist::CommStats s = comm.stats();
  if (dist::world().rank() == 0) std::cout << "  FSDP matmul forward+backward: " << s.str() << "\n";
  const int64_t w_bytes = w_host.nbytes();
  if (n > 1) {
    EXPECT_EQ(s.all_gather.calls, 1);  // the weight, once
    EXPECT_EQ(s.reduce_scatter.calls, 1);
    EXPECT_EQ(s.reduce_scatter.bytes, w_bytes);
    EXPECT_LT(s.all_reduce.bytes, w_bytes) << "the weight gradient was all-reduced";
    EXPECT_EQ(dist::sharding_of(grads["w"])->spec, (PartitionSpec{"data", ""}));
  }
  auto [ref_loss, ref_grads] = value_and_grad([&](const Params& q) { return sum(square(matmul(x_host, q["w"]))); })(
      Params{{"w", w_host}});
  auto a = dist::to_host(grads["w"]).to_doubles(), b = ref_grads["w"].to_doubles();
  double err = 0;
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i]) / (1 + std::abs(b[i])));
  if (dist::world().rank() == 0) std::cout << "  [max err] FSDP weight gradient vs one device: " << err << "\n";
  EXPECT_LE(err, 1e-5);
  EXPECT_NEAR(dist::to_host(loss).item() / ref_loss.item(), 1.0, 1e-6);
}

// A weight used twice (GPT-2's tied embedding and head) gets two gradients. The backward
// sums the second into the first one's storage, on one device and when both are split
// over the ranks, so the pair holds one gradient more than a single use at its peak; a new
// array for the sum held two more.
TEST(SpmdTrain, BackwardSumsASecondGradientIntoTheFirstsStorage) {
  const int n = dist::world().size();
  Mesh mesh = Mesh::from_string("data=" + std::to_string(n));
  const int64_t rows = 256 * n, cols = 1024;  // each rank's block: 1 MiB of f32
  Params p{{"w", dist::shard(random_normal({rows, cols}, 51), mesh, PartitionSpec{"data", ""}, "w")}};
  auto peak_of = [&](const std::function<Array(const Params&)>& f) {
    CachingAllocator::instance().reset_peak();
    const size_t before = CachingAllocator::instance().stats().bytes_in_use;
    auto [loss, grads] = value_and_grad(f)(p);
    const size_t peak = CachingAllocator::instance().stats().peak_bytes_in_use - before;
    return std::make_pair(peak, dist::to_host(grads["w"]).to_doubles());
  };
  // Each use's gradient is a new block of ones (sum's VJP broadcasts its cotangent).
  const auto [once, g_once] = peak_of([&](const Params& q) { return sum(q["w"]); });
  const auto [twice, g_twice] = peak_of([&](const Params& q) { return add(sum(q["w"]), sum(q["w"])); });
  const size_t block = size_t(rows / n * cols * 4);
  if (dist::world().rank() == 0)
    std::cout << "  backward peak above the start: one use " << once << " B, two uses " << twice << " B (block "
              << block << " B)\n";
  EXPECT_LE(twice, once + block + block / 4) << "the second gradient was not summed in place";
  EXPECT_EQ(g_once, std::vector<double>(size_t(rows * cols), 1.0));
  EXPECT_EQ(g_twice, std::vector<double>(size_t(rows * cols), 2.0));
}

// An FSDP embedding table (split over the data axis, on its rows or its columns) with fewer
// ids than rows: the ids are gathered and each rank looks its block up for every id, so
// neither the table nor its gradient ever moves whole; with more ids than rows the rule's
// route (the table gathered, its gradient reduce-scattered) stays. Both equal one device,
// and a padding id passes no gradient either way.
TEST(SpmdTrain, FsdpEmbeddingGathersTheIdsWhenFewerThanTheTableRows) {
  const int n = dist::world().size();
  Mesh mesh = Mesh::from_string("data=" + std::to_string(n));
  dist::Communicator& comm = mesh.axis_comm("data");
  for (const bool few_ids : {true, false}) {
    for (const PartitionSpec& table_spec : {PartitionSpec{"data", ""}, PartitionSpec{"", "data"}}) {
      for (const std::optional<int64_t> padding : {std::optional<int64_t>(), std::optional<int64_t>(1)}) {
        const int64_t rows = few_ids ? 8 * kTime * n : 2 * n;  // ids: 2n x kTime
        const Array table_host = random_normal({rows, 8 * n}, 41);
        // Every rank's ids hold the padding id 1 (and others) at a few positions.
        std::vector<int64_t> id_values(size_t(2 * n * kTime));
        for (size_t i = 0; i < id_values.size(); ++i) id_values[i] = i % 5 == 0 ? 1 : int64_t(i * 7919 % rows);
        const Array ids_host = Array::from_vector(id_values, Shape{2 * n, kTime});
        const Array mix = random_normal({8 * n, 8 * n}, 43);
        const Array ids = dist::shard(ids_host, mesh, PartitionSpec{"data", ""}, "ids");
        Params p{{"table", dist::shard(table_host, mesh, table_spec, "table")}};
        auto f = [&](const Array& tokens, const Params& q) {
          return sum(square(tanh(matmul(embedding(q["table"], tokens, padding), mix))));
        };
        comm.reset_stats();
        auto [loss, grads] = value_and_grad([&](const Params& q) { return f(ids, q); })(p);
        const dist::CommStats s = comm.stats();
        const std::string what = std::string(few_ids ? "fewer ids than rows" : "more ids than rows") + ", table " +
                                 table_spec.str() + (padding ? ", padding id 1" : "");
        if (dist::world().rank() == 0) std::cout << "  FSDP embedding, " << what << ": " << s.str() << "\n";
        const int64_t table_bytes = table_host.nbytes();
        if (n > 1 && few_ids) {
          EXPECT_LT(s.all_gather.bytes, table_bytes / 2) << what;
          EXPECT_LT(s.reduce_scatter.bytes, table_bytes / 2) << what;
          EXPECT_LT(s.all_reduce.bytes, table_bytes / 2) << what;
        }
        if (n > 1 && !few_ids) EXPECT_EQ(s.reduce_scatter.bytes, table_bytes) << what;
        if (n > 1) EXPECT_EQ(dist::sharding_of(grads["table"])->spec, table_spec) << what;
        auto [ref_loss, ref_grads] =
            value_and_grad([&](const Params& q) { return f(ids_host, q); })(Params{{"table", table_host}});
        auto a = dist::to_host(grads["table"]).to_doubles(), b = ref_grads["table"].to_doubles();
        double err = 0;
        for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i]) / (1 + std::abs(b[i])));
        if (dist::world().rank() == 0) std::cout << "  [max err] table gradient vs one device: " << err << "\n";
        EXPECT_LE(err, 1e-5) << what;
        EXPECT_NEAR(dist::to_host(loss).item() / ref_loss.item(), 1.0, 1e-6) << what;
      }
    }
  }
}

}  // namespace
}  // namespace mt::testing

namespace mt::testing {
namespace {

// The vocab-parallel pair: embedding lookups and cross-entropy over a class-split head
// exchange only per-row statistics, never the logits.
TEST(SpmdTrain, VocabParallelEmbeddingAndLossNeverGatherLogits) {
  const int n = dist::world().size();
  dist::Mesh mesh = dist::Mesh::from_string("model=" + std::to_string(n));
  const int64_t vocab = 8 * n * 4;
  Array ids = random_ints({kBatch, kTime}, 21, 0, vocab), labels = random_ints({kBatch, kTime}, 22, 0, vocab);
  Params p{{"wte", dist::shard(random_normal({vocab, kWidth}, 23), mesh, dist::PartitionSpec{"model", ""}, "wte")},
           {"head", dist::shard(random_normal({kWidth, vocab}, 24), mesh, dist::PartitionSpec{"", "model"}, "head")}};
  auto f = [&](const Params& q) { return cross_entropy(matmul(tanh(embedding(q["wte"], ids)), q["head"]), labels); };
  dist::Communicator& comm = mesh.axis_comm("model");
  comm.reset_stats();
  auto [loss, grads] = value_and_grad(f)(p);
  dist::CommStats stats = comm.stats();
  if (dist::world().rank() == 0) std::cout << "  vocab-parallel step: " << stats.str() << "\n";
  EXPECT_EQ(stats.all_gather.calls + stats.all_to_all.calls + stats.reduce_scatter.calls, 0);
  // The largest message is per-row statistics or the embedding output, not (B, T, V) logits.
  EXPECT_LT(stats.all_reduce.bytes, int64_t(stats.all_reduce.calls) * kBatch * kTime * kWidth * 4 + 1);
  // And the numbers equal the one-device computation.
  Params host{{"wte", dist::to_host(p["wte"])}, {"head", dist::to_host(p["head"])}};
  auto [ref_loss, ref_grads] = value_and_grad(f)(host);
  EXPECT_NEAR(dist::to_host(loss).item(), ref_loss.item(), 1e-5);
  for (const char* path : {"wte", "head"}) {
    auto a = dist::to_host(grads[path]).to_doubles(), b = ref_grads[path].to_doubles();
    double err = 0;
    for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i]));
    EXPECT_LE(err, 1e-6) << path;
  }
}

// With small buckets the data-parallel all-reduces start while the backward pass still runs,
// and the step still equals the one-device step.
TEST(SpmdTrain, BucketedGradientReductionOverlapsBackward) {
  const int n = dist::world().size();
  const RunResult ref = train("single", nullptr, 2);
  dist::set_grad_bucket_bytes(4096);
  dist::Mesh mesh = dist::Mesh::from_string("data=" + std::to_string(n));
  const RunResult got = train("dp", &mesh, 2);
  dist::GradReductionStats stats = dist::last_grad_reduction();
  dist::set_grad_bucket_bytes(size_t(32) << 20);
  if (dist::world().rank() == 0)
    std::cout << "  buckets: " << stats.buckets << ", started during backward: " << stats.buckets_during_backward << "\n";
  if (n > 1) {
    EXPECT_GT(stats.buckets, 2);
    EXPECT_GE(stats.buckets_during_backward, stats.buckets - 1);
  }
  double err = 0;
  for (const auto& [path, w] : ref.params) {
    auto a = w.to_doubles(), b = got.params[path].to_doubles();
    for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i]));
  }
  EXPECT_LE(err, 2e-5);
}

// Sets the wire dtype of gradient reductions for a scope (a failing check must not leave
// bf16 set for the tests after it).
struct GradReduceDtypeScope {
  explicit GradReduceDtypeScope(DType dtype) { dist::set_grad_reduce_dtype(dtype); }
  ~GradReduceDtypeScope() { dist::set_grad_reduce_dtype(DType::f32); }
};

// Each rank's f32 terms of one gradient, and the reference for them: every term rounded to bf16,
// summed exactly (in double, as the reducer's sum of at most 8 bf16 terms is), rounded to f32
// and then to bf16.
std::vector<float> bf16_sum_of_bf16_terms(const Array& mine, int ranks) {
  const int64_t len = mine.numel();
  std::vector<float> terms(size_t(ranks * len));
  dist::world().all_gather(mine.raw(), terms.data(), len, DType::f32);
  std::vector<uint16_t> narrow(terms.size());
  f32_to_bf16_n(terms.data(), narrow.data(), int64_t(terms.size()));
  bf16_to_f32_n(narrow.data(), terms.data(), int64_t(terms.size()));
  std::vector<float> sum(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) {
    double acc = 0;
    for (int q = 0; q < ranks; ++q) acc += terms[size_t(q * len + i)];
    sum[size_t(i)] = float(acc);
  }
  std::vector<uint16_t> rounded(sum.size());
  f32_to_bf16_n(sum.data(), rounded.data(), len);
  bf16_to_f32_n(rounded.data(), sum.data(), len);
  return sum;
}

// --grad-reduce-dtype bf16: data-parallel gradient buckets travel in bf16 and are summed in
// f32 (or wider). Three gradients of 1001, 300 and 7 elements in 2 KiB buckets (two buckets in
// flight, slices padded): every rank ends with bf16(Σ_r bf16(g_r)) of each exactly, and the
// wire carries bf16 all-to-alls and all-gathers, no all-reduce, half the f32 bytes. A gradient
// partial over the model axis (data=2, model=2 on 4 ranks) keeps f32 all-reduces. Three AdamW
// steps of the tiny GPT stay close to the f32 reduction's.
TEST(SpmdTrain, Bf16GradientReductionRoundsOnceAndSumsInF32) {
  const int n = dist::world().size(), rank = dist::world().rank();
  if (n < 2) GTEST_SKIP() << "one process: no gradient travels";
  Mesh mesh = Mesh::from_string("data=" + std::to_string(n));
  const PartitionSpec partial = PartitionSpec::parse("None|partial=data");
  const std::vector<int64_t> lengths = {1001, 300, 7};
  std::vector<Array> mine;
  std::vector<std::vector<float>> expected;
  for (size_t k = 0; k < lengths.size(); ++k) {
    mine.push_back(random_normal({lengths[k]}, 300 + 10 * k + uint64_t(rank)));  // this rank's term
    expected.push_back(bf16_sum_of_bf16_terms(mine.back(), n));
  }
  dist::Communicator& comm = mesh.axis_comm("data");
  comm.reset_stats();
  std::vector<Array> out;
  {
    const GradReduceDtypeScope bf16(DType::bf16);
    dist::set_grad_bucket_bytes(2048);
    dist::GradReducer reducer;
    for (size_t k = 0; k < mine.size(); ++k)
      reducer.add(k, dist::global_view(mine[k], dist::Sharding{mesh, partial}), mesh, partial.without_partial());
    out = reducer.finish(mine.size());
    dist::set_grad_bucket_bytes(size_t(32) << 20);
  }
  const dist::CommStats s = comm.stats();
  int64_t differ = 0, wire = 0;
  for (size_t k = 0; k < mine.size(); ++k) {
    ASSERT_TRUE(out[k].defined());
    EXPECT_EQ(out[k].dtype(), DType::f32);
    const std::vector<double> got = dist::to_host(out[k]).to_doubles();
    ASSERT_EQ(got.size(), expected[k].size());
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != double(expected[k][i]);
  }
  EXPECT_EQ(differ, 0) << "elements differ from bf16(sum of bf16 terms)";
  // Buckets: 1001 elements alone (4004 bytes >= 2 KiB), then 300 + 7 together at the end.
  for (int64_t elements : {int64_t(1001), int64_t(307)}) wire += 2 * ((elements + n - 1) / n) * n;
  if (rank == 0) std::cout << "  bf16 gradient reduction of 1308 f32 elements in 2 buckets: " << s.str() << "\n";
  EXPECT_EQ(s.all_reduce.calls, 0);
  EXPECT_EQ(s.all_to_all.calls, 2);
  EXPECT_EQ(s.all_to_all.bytes, wire);
  EXPECT_EQ(s.all_gather.calls, 2);
  EXPECT_EQ(s.all_gather.bytes, wire / n);
  EXPECT_LE(s.all_to_all.bytes, 1308 * 4 / 2 + 4 * n) << "about half the f32 bytes";

  if (n == 4) {  // the model axis: tensor-parallel partial sums stay f32
    Mesh dm = Mesh::from_string("data=2,model=2");
    const PartitionSpec over_model = PartitionSpec::parse("None|partial=model");
    dist::Communicator& model_comm = dm.axis_comm("model");
    model_comm.reset_stats();
    const GradReduceDtypeScope bf16(DType::bf16);
    dist::GradReducer reducer;
    reducer.add(0, dist::global_view(mine[1], dist::Sharding{dm, over_model}), dm, over_model.without_partial());
    const Array reduced = reducer.finish(1)[0];
    const dist::CommStats ms = model_comm.stats();
    EXPECT_EQ(ms.all_reduce.calls, 1);
    EXPECT_EQ(ms.all_to_all.calls, 0);
    EXPECT_EQ(ms.all_reduce.bytes, 300 * 4) << "a model-axis gradient travelled narrowed";
    EXPECT_EQ(reduced.dtype(), DType::f32);
  }

  // Training: the same three steps with f32 and with bf16 on the wire.
  const RunResult f32_run = train("dp", &mesh, 3);
  RunResult bf16_run;
  {
    const GradReduceDtypeScope bf16(DType::bf16);
    bf16_run = train("dp", &mesh, 3);
  }
  double loss_err = 0, param_max = 0, param_sq = 0;
  int64_t param_count = 0;
  for (size_t i = 0; i < f32_run.losses.size(); ++i)
    loss_err = std::max(loss_err, std::abs(bf16_run.losses[i] - f32_run.losses[i]) / std::abs(f32_run.losses[i]));
  for (const auto& [path, w] : f32_run.params) {
    auto a = w.to_doubles(), b = bf16_run.params[path].to_doubles();
    for (size_t i = 0; i < a.size(); ++i) {
      param_max = std::max(param_max, std::abs(a[i] - b[i]));
      param_sq += (a[i] - b[i]) * (a[i] - b[i]);
    }
    param_count += int64_t(a.size());
  }
  const double param_rms = std::sqrt(param_sq / double(param_count));
  if (rank == 0)
    std::cout << "  [max err] bf16 vs f32 gradient reduction, 3 AdamW steps: loss " << loss_err
              << " relative, params " << param_max << " (rms " << param_rms << ")\n";
  EXPECT_EQ(bf16_run.losses[0], f32_run.losses[0]) << "the first loss comes before any reduction";
  EXPECT_LE(loss_err, 1e-3);
  // Adam divides each gradient by its own scale, so an element whose ranks' terms nearly cancel
  // (their bf16 rounding then large against the sum) can move by about the learning rate (1e-2;
  // 0.011 at 8 ranks): the bound is on the mean, a tenth of the learning rate.
  EXPECT_LE(param_rms, 1e-3);
}

// FSDP under --grad-reduce-dtype bf16. reduce_scatter_dim_bf16 on each rank's term of a 3n x 37
// f32 array keeps Σ_r bf16(term_r) of its rows exactly, in one all-to-all of half the bytes. A
// weight split over the data axis gets its gradient that way (no f32 reduce-scatter), close to
// one device's; three AdamW steps of the tiny GPT under FSDP stay close to the f32 ones.
// The gradient of sum(square(x · w)) for a weight laid out as `split` (FSDP), with `wire` on the
// data axis: that axis's traffic, and the largest error against the one-device gradient `ref`
// with ref's largest magnitude. The gradient keeps the weight's layout.
struct FsdpGradient {
  dist::CommStats traffic;
  double err = 0, scale = 0;
};
FsdpGradient fsdp_weight_gradient(const Array& x, const Array& w_host, const Array& ref, const Mesh& mesh,
                                  const PartitionSpec& split, DType wire) {
  Params p{{"w", dist::shard(w_host, mesh, split, "w")}};
  dist::Communicator& comm = mesh.axis_comm("data");
  comm.reset_stats();
  Params grads;
  {
    const GradReduceDtypeScope scope(wire);
    grads = value_and_grad([&](const Params& q) { return sum(square(matmul(x, q["w"]))); })(p).second;
  }
  FsdpGradient out{comm.stats()};
  EXPECT_EQ(dist::sharding_of(grads["w"])->spec, split);
  const std::vector<double> a = dist::to_host(grads["w"]).to_doubles(), b = ref.to_doubles();
  for (size_t i = 0; i < a.size(); ++i)
    out.err = std::max(out.err, std::abs(a[i] - b[i])), out.scale = std::max(out.scale, std::abs(b[i]));
  return out;
}

TEST(SpmdTrain, FsdpGradientsReduceScatterInBf16) {
  const int n = dist::world().size(), rank = dist::world().rank();
  if (n < 2) GTEST_SKIP() << "one process: no gradient travels";
  Mesh mesh = Mesh::from_string("data=" + std::to_string(n));
  dist::Communicator& comm = mesh.axis_comm("data");
  const int64_t rows = 3 * n, cols = 37;
  const Array term = random_normal({rows, cols}, 500 + uint64_t(rank));
  std::vector<float> terms(size_t(n * rows * cols));
  dist::world().all_gather(term.raw(), terms.data(), rows * cols, DType::f32);
  std::vector<uint16_t> narrow(terms.size());
  f32_to_bf16_n(terms.data(), narrow.data(), int64_t(terms.size()));
  bf16_to_f32_n(narrow.data(), terms.data(), int64_t(terms.size()));
  comm.reset_stats();
  const std::vector<double> mine = dist::reduce_scatter_dim_bf16(term, 0, comm).to_doubles();
  const dist::CommStats direct = comm.stats();
  ASSERT_EQ(mine.size(), size_t(3 * cols));
  int64_t differ = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    double acc = 0;  // Σ_r bf16(term_r) in double, then f32: not rounded to bf16 again
    for (int q = 0; q < n; ++q) acc += terms[size_t(q * rows * cols + rank * 3 * cols) + i];
    differ += mine[i] != double(float(acc));
  }
  EXPECT_EQ(differ, 0) << "elements of this rank's rows differ from the sum of bf16 terms";
  EXPECT_EQ(direct.all_to_all.calls, 1);
  EXPECT_EQ(direct.all_to_all.bytes, rows * cols * 2);
  EXPECT_EQ(direct.reduce_scatter.calls, 0);
  // Along dim 1 (FSDP splits the largest divisible dim): blocks of columns, transposed out.
  const Array wide = random_normal({5, 4 * n}, 600 + uint64_t(rank));
  std::vector<float> wide_terms(size_t(n * 5 * 4 * n));
  dist::world().all_gather(wide.raw(), wide_terms.data(), 5 * 4 * n, DType::f32);
  std::vector<uint16_t> wide_narrow(wide_terms.size());
  f32_to_bf16_n(wide_terms.data(), wide_narrow.data(), int64_t(wide_terms.size()));
  bf16_to_f32_n(wide_narrow.data(), wide_terms.data(), int64_t(wide_terms.size()));
  const Array columns = dist::reduce_scatter_dim_bf16(wide, 1, comm);
  ASSERT_EQ(columns.shape(), (Shape{5, 4}));
  const std::vector<double> got_columns = columns.to_doubles();
  int64_t column_differ = 0;
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      double acc = 0;
      for (int q = 0; q < n; ++q) acc += wide_terms[size_t(q * 5 * 4 * n + i * 4 * n + rank * 4 + j)];
      column_differ += got_columns[size_t(i * 4 + j)] != double(float(acc));
    }
  EXPECT_EQ(column_differ, 0) << "elements of this rank's columns differ from the sum of bf16 terms";

  // An FSDP weight's gradient (as FsdpWeightGradientIsReduceScatteredNotAllReduced), the weight
  // split over its rows and over its columns.
  const Array x_host = random_normal({2 * n, kTime, kWidth}, 31), w_host = random_normal({kWidth, 4 * n}, 32);
  const Array x = dist::shard(x_host, mesh, PartitionSpec{"data", "", ""}, "x");
  auto [ref_loss, ref_grads] = value_and_grad([&](const Params& q) { return sum(square(matmul(x_host, q["w"]))); })(
      Params{{"w", w_host}});
  for (const PartitionSpec& split : {PartitionSpec{"data", ""}, PartitionSpec{"", "data"}}) {
    const auto [s, err, scale] = fsdp_weight_gradient(x, w_host, ref_grads["w"], mesh, split, DType::bf16);
    if (rank == 0)
      std::cout << "  FSDP weight " << split.str() << ", gradient with bf16 on the wire: " << s.str()
                << "; max err vs one device " << err << " (of max " << scale << ")\n";
    EXPECT_EQ(s.reduce_scatter.calls, 0) << "the weight gradient was reduce-scattered in f32";
    EXPECT_EQ(s.all_to_all.calls, 1);
    EXPECT_EQ(s.all_to_all.bytes, w_host.nbytes() / 2);
    EXPECT_LE(err, 2.0 * n * scale / 256) << "beyond the bf16 rounding of each rank's term";
  }

  comm.reset_stats();
  const RunResult f32_run = train("fsdp", &mesh, 3);
  const dist::CommStats f = comm.stats();
  comm.reset_stats();
  RunResult bf16_run;
  {
    const GradReduceDtypeScope bf16(DType::bf16);
    bf16_run = train("fsdp", &mesh, 3);
  }
  const dist::CommStats t = comm.stats();
  double loss_err = 0, param_sq = 0;
  int64_t param_count = 0;
  for (size_t i = 0; i < f32_run.losses.size(); ++i)
    loss_err = std::max(loss_err, std::abs(bf16_run.losses[i] - f32_run.losses[i]) / std::abs(f32_run.losses[i]));
  for (const auto& [path, w] : f32_run.params) {
    auto a = w.to_doubles(), b = bf16_run.params[path].to_doubles();
    for (size_t i = 0; i < a.size(); ++i) param_sq += (a[i] - b[i]) * (a[i] - b[i]);
    param_count += int64_t(a.size());
  }
  const double param_rms = std::sqrt(param_sq / double(param_count));
  if (rank == 0)
    std::cout << "  [max err] FSDP, bf16 vs f32 gradient reduction, 3 AdamW steps: loss " << loss_err
              << " relative, params rms " << param_rms << "; on the data axis, f32: " << f.str() << "; bf16: " << t.str()
              << "\n";
  // Every f32 reduce-scatter (the FSDP weights') became an all-to-all; the replicated 1-D
  // parameters' buckets add their own.
  EXPECT_GT(f.reduce_scatter.calls, 0);
  EXPECT_EQ(t.reduce_scatter.calls, 0) << "an FSDP weight gradient was reduce-scattered in f32";
  EXPECT_GE(t.all_to_all.calls, f.reduce_scatter.calls);
  EXPECT_LE(loss_err, 1e-4);
  EXPECT_LE(param_rms, 1e-3);
}

// FSDP on a data x model mesh: a weight split over data on one dim and over model on the other
// is gathered over data only; its gradient comes back partial over data and model-split, and
// under --grad-reduce-dtype bf16 that reduce-scatter moves bf16 as on a data-only mesh: one
// all-to-all of half the bytes on the data axis, no f32 reduce-scatter, the layout kept, the
// values within each rank's bf16 rounding of the one-device gradient.
TEST(SpmdTrain, FsdpGradientsOnADataByModelMeshReduceScatterInBf16) {
  const int n = dist::world().size(), rank = dist::world().rank();
  if (n != 4 && n != 8) GTEST_SKIP() << "needs 4 or 8 processes for data x model";
  const int data = n / 2;
  Mesh mesh = Mesh::from_string("data=" + std::to_string(data) + ",model=2");
  const Array x_host = random_normal({2 * data, kTime, kWidth}, 31), w_host = random_normal({kWidth, 4 * n}, 32);
  const Array x = dist::shard(x_host, mesh, PartitionSpec{"data", "", ""}, "x");
  auto [ref_loss, ref_grads] = value_and_grad([&](const Params& q) { return sum(square(matmul(x_host, q["w"]))); })(
      Params{{"w", w_host}});
  for (const PartitionSpec& split : {PartitionSpec{"data", "model"}, PartitionSpec{"model", "data"}}) {
    for (const DType wire : {DType::f32, DType::bf16}) {
      const auto [s, err, scale] = fsdp_weight_gradient(x, w_host, ref_grads["w"], mesh, split, wire);
      if (rank == 0)
        std::cout << "  FSDP weight " << split.str() << " on " << mesh.str() << ", gradient in " << dtype_name(wire)
                  << " on the data axis: " << s.str() << "; max err vs one device " << err << " (of max " << scale
                  << ")\n";
      if (wire == DType::f32) {
        EXPECT_GT(s.reduce_scatter.calls, 0);
        EXPECT_LE(err, 1e-4 * scale);
      } else {
        EXPECT_EQ(s.reduce_scatter.calls, 0) << "the weight gradient was reduce-scattered in f32";
        EXPECT_EQ(s.all_to_all.calls, 1);
        EXPECT_EQ(s.all_to_all.bytes, w_host.nbytes() / 2 / 2) << "this rank's model half, in bf16";
        EXPECT_LE(err, 2.0 * data * scale / 256) << "beyond the bf16 rounding of each rank's term";
        EXPECT_GT(err, 0) << "equal to f32's: nothing was rounded";
      }
    }
  }
}

TEST(SpmdTrain, MismatchedMeshesAreAnErrorOnEveryRank) {
  const int n = dist::world().size();
  if (n < 2) return;
  dist::Mesh a = dist::Mesh::from_string("data=" + std::to_string(n));
  dist::Mesh b = dist::Mesh::from_string("model=" + std::to_string(n));
  Array x = dist::shard(random_normal({4 * n, 2}, 1), a, dist::PartitionSpec{"data", ""});
  Array y = dist::shard(random_normal({4 * n, 2}, 2), b, dist::PartitionSpec{"model", ""});
  expect_error([&] { add(x, y); }, {"[add]", "different meshes", "data=", "model="});
}

}  // namespace
}  // namespace mt::testing
