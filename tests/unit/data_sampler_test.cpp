// IndexSampler: per-epoch permutations keyed by (seed, epoch), global batches sharded
// across processes, drop-remainder or padding, and an exactly restorable position.
#include <gtest/gtest.h>

#include "tests/support/op_check.h"
#include "tests/support/temp_dir.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "meshtrain/meshtrain.h"

namespace mt::data {
namespace {

using mt::testing::expect_error;
using mt::testing::TempDir;


std::vector<SampledBatch> drain(IndexSampler& s, int64_t max = 1 << 20) {
  std::vector<SampledBatch> out;
  while (int64_t(out.size()) < max) {
    auto b = s.next();
    if (!b) break;
    out.push_back(std::move(*b));
  }
  return out;
}

bool same(const SampledBatch& a, const SampledBatch& b) {
  return a.epoch == b.epoch && a.batch == b.batch && a.indices == b.indices && a.is_padding == b.is_padding;
}

TEST(IndexSampler, EpochOrdersArePermutationsKeyedBySeedAndEpoch) {
  IndexSampler s(100, {.seed = 7, .num_epochs = kInfiniteEpochs});
  std::vector<int64_t> identity(100);
  std::iota(identity.begin(), identity.end(), 0);
  std::set<std::vector<int64_t>> seen;
  for (int64_t e = 0; e < 5; ++e) {
    auto order = s.epoch_order(e);
    seen.insert(order);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, identity) << "epoch " << e;
  }
  EXPECT_EQ(seen.size(), 5u);  // every epoch is reshuffled
  EXPECT_EQ(s.epoch_order(3), IndexSampler(100, {.seed = 7}).epoch_order(3));
  EXPECT_NE(s.epoch_order(0), IndexSampler(100, {.seed = 8}).epoch_order(0));
  EXPECT_EQ(IndexSampler(100, {.shuffle = false}).epoch_order(4), identity);

  // Unbiased: over many epochs each element leads equally often.
  IndexSampler small(5, {.seed = 1});
  std::vector<int> first(5, 0);
  const int epochs = 20000;
  for (int e = 0; e < epochs; ++e) ++first[size_t(small.epoch_order(e)[0])];
  for (int k = 0; k < 5; ++k) {
    std::cout << "  element " << k << " first in " << first[size_t(k)] << " of " << epochs << " epochs\n";
    EXPECT_NEAR(first[size_t(k)], epochs / 5, 250);  // ~4.5 standard deviations
  }

  const auto t0 = std::chrono::steady_clock::now();
  IndexSampler big(1'000'000, {.seed = 3, .batch_size = 64});
  const auto order = big.epoch_order(0);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "  permutation of 1e6 examples: " << ms << " ms\n";
  EXPECT_EQ(order.size(), 1'000'000u);
}

TEST(IndexSampler, AnyEpochAndBatchIsReproducibleAlone) {
  const SamplerOptions opts{.seed = 42, .num_epochs = 3, .batch_size = 8};
  IndexSampler full(50, opts);
  const auto all = drain(full);
  ASSERT_EQ(int64_t(all.size()), full.total_batches());
  EXPECT_EQ(full.batches_per_epoch(), 6);
  EXPECT_EQ(all.size(), 18u);
  EXPECT_TRUE(full.done());
  EXPECT_FALSE(full.next().has_value());

  IndexSampler fresh(50, opts);
  for (const auto& b : all) EXPECT_TRUE(same(fresh.batch_at(b.epoch, b.batch), b));
  fresh.restore({.epoch = 2, .batch = 3});
  const auto tail = drain(fresh);
  ASSERT_EQ(tail.size(), 3u);
  for (size_t k = 0; k < tail.size(); ++k) EXPECT_TRUE(same(tail[k], all[15 + k]));
  expect_error([&] { fresh.batch_at(3, 0); }, {"[IndexSampler] batch (epoch 3, batch 0) out of range: 3 epochs of 6"});
}

TEST(IndexSampler, DropRemainderOrPadTheLastBatch) {
  IndexSampler dropped(10, {.shuffle = false, .drop_remainder = true, .batch_size = 4});
  const auto d = drain(dropped);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[1].indices, (std::vector<int64_t>{4, 5, 6, 7}));

  IndexSampler padded(10, {.seed = 5, .drop_remainder = false, .batch_size = 4});
  const auto p = drain(padded);
  ASSERT_EQ(p.size(), 3u);
  const auto order = padded.epoch_order(0);
  EXPECT_EQ(p[2].indices, (std::vector<int64_t>{order[8], order[9], order[0], order[1]}));
  EXPECT_EQ(p[2].is_padding, (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(p[2].num_real(), 2);
  EXPECT_EQ(p[0].num_real(), 4);
  // A batch larger than the dataset wraps around repeatedly.
  IndexSampler tiny(3, {.shuffle = false, .drop_remainder = false, .batch_size = 8});
  const auto t = tiny.next();
  EXPECT_EQ(t->indices, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1}));
  EXPECT_EQ(t->num_real(), 3);
}

TEST(IndexSampler, ShardsEveryGlobalBatchAcrossProcesses) {
  for (bool drop : {true, false}) {
    const int64_t n = 29, global = 8;
    IndexSampler single(n, {.seed = 9, .drop_remainder = drop, .num_epochs = 2, .batch_size = global});
    const auto reference = drain(single);
    for (int count : {2, 4, 8}) {
      std::vector<std::vector<SampledBatch>> per_process;
      for (int p = 0; p < count; ++p) {
        IndexSampler s(n, {.seed = 9, .drop_remainder = drop, .num_epochs = 2, .process_index = p,
                           .process_count = count, .batch_size = global});
        EXPECT_EQ(s.local_batch_size(), global / count);
        per_process.push_back(drain(s));
        ASSERT_EQ(per_process.back().size(), reference.size()) << "same number of batches on every process";
      }
      for (size_t b = 0; b < reference.size(); ++b) {
        std::vector<int64_t> joined;
        std::vector<bool> padding;
        for (int p = 0; p < count; ++p) {
          const auto& part = per_process[size_t(p)][b];
          joined.insert(joined.end(), part.indices.begin(), part.indices.end());
          padding.insert(padding.end(), part.is_padding.begin(), part.is_padding.end());
        }
        EXPECT_EQ(joined, reference[b].indices) << "processes " << count << " batch " << b;
        EXPECT_EQ(padding, reference[b].is_padding);
      }
    }
    // Each epoch visits every example once (plus padding when not dropping).
    std::multiset<int64_t> visited;
    for (size_t b = 0; b < reference.size() / 2; ++b) {
      for (size_t k = 0; k < reference[b].indices.size(); ++k) {
        if (!reference[b].is_padding[k]) visited.insert(reference[b].indices[k]);
      }
    }
    EXPECT_EQ(visited.size(), drop ? 24u : 29u);
    EXPECT_EQ(std::set<int64_t>(visited.begin(), visited.end()).size(), visited.size());
  }
}

TEST(IndexSampler, InfiniteEpochs) {
  IndexSampler s(7, {.seed = 2, .num_epochs = kInfiniteEpochs, .batch_size = 3});
  EXPECT_EQ(s.total_batches(), kInfiniteEpochs);
  const auto batches = drain(s, 100);
  ASSERT_EQ(batches.size(), 100u);
  EXPECT_FALSE(s.done());
  EXPECT_EQ(s.state().epoch, 50);  // 2 batches per epoch
  EXPECT_EQ(batches[99].epoch, 49);
}

TEST(IndexSampler, StateRoundTripsThroughJsonAcrossProcessCounts) {
  const SamplerOptions opts{.seed = 11, .drop_remainder = false, .num_epochs = 3, .batch_size = 6};
  IndexSampler full(20, opts);
  const auto all = drain(full);
  ASSERT_EQ(all.size(), 12u);

  // Save on "process 1 of 2" after 5 batches, resume on a single process.
  SamplerOptions sharded = opts;
  sharded.process_index = 1;
  sharded.process_count = 2;
  IndexSampler a(20, sharded);
  drain(a, 5);
  const std::string saved = nlohmann::json(a.state()).dump();
  std::cout << "  saved state: " << saved << "\n";
  EXPECT_EQ(saved, R"({"batch":1,"batch_size":6,"epoch":1,"num_examples":20,"seed":11,"shuffle":true})");
  IndexSampler b(20, opts);
  b.restore(nlohmann::json::parse(saved).get<SamplerState>());
  EXPECT_EQ(b.state(), a.state());
  const auto tail = drain(b);
  ASSERT_EQ(tail.size(), 7u);
  for (size_t k = 0; k < tail.size(); ++k) EXPECT_TRUE(same(tail[k], all[5 + k]));
  // The state after the last batch restores to "done".
  IndexSampler c(20, opts);
  c.restore(full.state());
  EXPECT_TRUE(c.done());

  // A position saved for other data or settings is refused.
  expect_error([&] { IndexSampler(21, opts).restore(a.state()); }, {"for 20 examples, this dataset has 21"});
  SamplerOptions other = opts;
  other.batch_size = 4;
  expect_error([&] { IndexSampler(20, other).restore(a.state()); }, {"global batch size 6, this sampler uses 4"});
  other = opts;
  other.seed = 12;
  expect_error([&] { IndexSampler(20, other).restore(a.state()); }, {"seed 11, this sampler uses seed 12"});
  other = opts;
  other.shuffle = false;
  expect_error([&] { IndexSampler(20, other).restore(a.state()); }, {"shuffle=true, this sampler uses shuffle=false"});
  expect_error([&] { IndexSampler(20, opts).restore({.epoch = 0, .batch = 4}); },
               {"saved position (epoch 0, batch 4) is out of range for 3 epochs of 4 batches"});
  expect_error([&] { IndexSampler(20, opts).restore({.epoch = 3, .batch = 1}); }, {"out of range"});
  expect_error([&] { nlohmann::json::parse(R"({"epoch": 1})").get<SamplerState>(); },
               {"[SamplerState] expected a JSON object with integer 'epoch' and 'batch'"});
}

TEST(IndexSampler, RejectsBadOptions) {
  expect_error([&] { IndexSampler(0, {}); }, {"[IndexSampler] the dataset is empty"});
  expect_error([&] { IndexSampler(10, {.process_count = 2, .batch_size = 3}); },
               {"global batch size 3 must be a positive multiple of process_count 2"});
  expect_error([&] { IndexSampler(10, {.process_index = 2, .process_count = 2, .batch_size = 4}); },
               {"process_index 2 out of range for process_count 2"});
  expect_error([&] { IndexSampler(10, {.num_epochs = 0}); }, {"num_epochs must be >= 1"});
  expect_error([&] { IndexSampler(5, {.drop_remainder = true, .batch_size = 8}); },
               {"5 examples make no full batch of 8 with drop_remainder"});
}

}  // namespace
}  // namespace mt::data
