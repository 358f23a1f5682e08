// DataLoader: batches in sampler order, collate on a background thread overlapping the
// consumer, exact resume from the consumed position, errors rethrown on the consumer
// side with the batch named, and clean shutdown with a full queue.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "meshtrain/meshtrain.h"

namespace mt::data {
namespace {

using namespace std::chrono_literals;
using Ids = std::vector<int64_t>;

std::vector<Example> make_examples(int64_t n) {
  std::vector<Example> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(Example{{"id", i}, {"text", "example " + std::to_string(i)}});
  return out;
}

// Collate to the ids of the batch, checking the text field travelled with them.
Ids collate_ids(const std::vector<Example>& batch) {
  Ids ids;
  for (const auto& ex : batch) {
    ids.push_back(ex.as_int("id"));
    EXPECT_EQ(ex.str("text"), "example " + std::to_string(ids.back()));
  }
  return ids;
}

std::vector<Ids> drain(DataLoader<Ids>& loader, int64_t max = 1 << 20) {
  std::vector<Ids> out;
  while (int64_t(out.size()) < max) {
    auto b = loader.next();
    if (!b) break;
    EXPECT_EQ(b->data, b->info.indices);
    out.push_back(std::move(b->data));
  }
  return out;
}

// Waits (bounded) until pred holds: lets the producer run ahead where a test needs it.
template <class Pred>
bool wait_for(Pred pred) {
  for (int k = 0; k < 2000 && !pred(); ++k) std::this_thread::sleep_for(1ms);
  return pred();
}

const SamplerOptions kOpts{.seed = 3, .drop_remainder = false, .num_epochs = 2, .batch_size = 4};

TEST(DataLoader, BatchesFollowTheSamplerForAnyPrefetch) {
  IndexSampler reference(23, kOpts);
  std::vector<Ids> expected;
  while (auto b = reference.next()) expected.push_back(b->indices);
  ASSERT_EQ(expected.size(), 12u);
  for (int prefetch : {0, 1, 2, 5}) {
    DataLoader<Ids> loader(make_examples(23), IndexSampler(23, kOpts), collate_ids, prefetch);
    EXPECT_EQ(drain(loader), expected) << "prefetch " << prefetch;
    EXPECT_FALSE(loader.next().has_value());  // stays at the end
    EXPECT_EQ(loader.state().epoch, 2);
  }
  // Range-for, and the padding flags of the last batch of each epoch (23 = 5*4 + 3).
  DataLoader<Ids> loader(make_examples(23), IndexSampler(23, kOpts), collate_ids);
  int64_t count = 0;
  for (auto& batch : loader) {
    EXPECT_EQ(batch.data, expected[size_t(count)]);
    EXPECT_EQ(batch.info.num_real(), batch.info.batch == 5 ? 3 : 4);
    ++count;
  }
  EXPECT_EQ(count, 12);
}

TEST(DataLoader, DeterministicAcrossRunsAndShardedAcrossProcesses) {
  DataLoader<Ids> a(make_examples(23), IndexSampler(23, kOpts), collate_ids);
  DataLoader<Ids> b(make_examples(23), IndexSampler(23, kOpts), collate_ids, 1);
  const auto all = drain(a);
  EXPECT_EQ(all, drain(b));
  SamplerOptions other = kOpts;
  other.seed = 4;
  DataLoader<Ids> c(make_examples(23), IndexSampler(23, other), collate_ids);
  EXPECT_NE(all, drain(c));
  // Two "processes" each load half of every global batch.
  auto dataset = make_dataset(make_examples(23));
  std::vector<std::vector<Ids>> parts;
  for (int p = 0; p < 2; ++p) {
    SamplerOptions o = kOpts;
    o.process_index = p;
    o.process_count = 2;
    DataLoader<Ids> loader(dataset, IndexSampler(23, o), collate_ids);
    parts.push_back(drain(loader));
  }
  ASSERT_EQ(parts[0].size(), all.size());
  ASSERT_EQ(parts[1].size(), all.size());
  for (size_t k = 0; k < all.size(); ++k) {
    Ids joined = parts[0][k];
    joined.insert(joined.end(), parts[1][k].begin(), parts[1][k].end());
    EXPECT_EQ(joined, all[k]);
  }
}

TEST(DataLoader, ResumeFromSavedStateYieldsExactlyTheRemainingBatches) {
  DataLoader<Ids> full(make_examples(23), IndexSampler(23, kOpts), collate_ids);
  const auto all = drain(full);
  for (int64_t consumed : {0, 1, 5, 6, 11, 12}) {
    std::atomic<int> calls{0};
    std::string saved;
    {
      const int prefetch = 3;
      DataLoader<Ids> loader(make_examples(23), IndexSampler(23, kOpts),
                             [&](const std::vector<Example>& b) {
                               ++calls;
                               return collate_ids(b);
                             },
                             prefetch);
      const auto head = drain(loader, consumed);
      ASSERT_EQ(head, std::vector<Ids>(all.begin(), all.begin() + consumed));
      // Let the producer run as far ahead as it can: the state must still be the consumed position.
      const int64_t ahead = std::min<int64_t>(consumed + prefetch + 1, int64_t(all.size()));
      if (consumed > 0) {
        EXPECT_TRUE(wait_for([&] { return calls >= ahead; }));
      }
      const SamplerState st = loader.state();
      EXPECT_EQ(st.epoch * 6 + st.batch, consumed);
      saved = nlohmann::json(st).dump();
    }  // destroyed with prefetched batches pending
    DataLoader<Ids> resumed(make_examples(23), IndexSampler(23, kOpts), collate_ids);
    resumed.restore(nlohmann::json::parse(saved).get<SamplerState>());
    EXPECT_EQ(drain(resumed), std::vector<Ids>(all.begin() + consumed, all.end())) << "after " << consumed;
  }
  // Restoring a running loader rewinds it, discarding what was prefetched.
  DataLoader<Ids> loader(make_examples(23), IndexSampler(23, kOpts), collate_ids);
  drain(loader, 3);
  const SamplerState mark = loader.state();
  drain(loader, 4);
  loader.restore(mark);
  EXPECT_EQ(drain(loader), std::vector<Ids>(all.begin() + 3, all.end()));
}

// A dataset whose get() fails for one index.
class FailingDataset : public Dataset {
 public:
  int64_t size() const override { return 12; }
  Example get(int64_t index) const override {
    if (index == 9) throw Error("[FailingDataset] cannot decode example 9");
    return Example{{"id", index}, {"text", "example " + std::to_string(index)}};
  }
};

TEST(DataLoader, ErrorsReachTheConsumerInOrderWithContext) {
  const SamplerOptions opts{.shuffle = false, .batch_size = 4};
  for (int prefetch : {0, 2}) {
    DataLoader<Ids> loader(make_examples(12), IndexSampler(12, opts),
                           [](const std::vector<Example>& b) {
                             Ids ids = collate_ids(b);
                             if (ids[0] == 4) throw std::runtime_error("bad example 7");
                             return ids;
                           },
                           prefetch);
    ASSERT_EQ(loader.next()->data, (Ids{0, 1, 2, 3}));  // batches before the failure arrive
    for (int repeat = 0; repeat < 2; ++repeat) {        // the loader stays failed
      try {
        loader.next();
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        std::cout << "  prefetch " << prefetch << ": " << e.what() << "\n";
        EXPECT_STREQ(e.what(), "[DataLoader] collate failed on batch 1 of epoch 0 (examples 4, 5, 6, 7): bad example 7");
      }
    }
    EXPECT_EQ(loader.state().batch, 1);  // the failed batch is not consumed
    loader.restore({.epoch = 0, .batch = 2});
    EXPECT_EQ(loader.next()->data, (Ids{8, 9, 10, 11}));

    DataLoader<Ids> reading(std::make_shared<FailingDataset>(), IndexSampler(12, opts), collate_ids, prefetch);
    drain(reading, 2);
    try {
      reading.next();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      std::cout << "  prefetch " << prefetch << ": " << e.what() << "\n";
      EXPECT_STREQ(e.what(), "[DataLoader] reading examples failed on batch 2 of epoch 0 (examples 8, 9, 10, 11): "
                             "[FailingDataset] cannot decode example 9");
    }
  }
  // Construction errors.
  EXPECT_THROW(DataLoader<Ids>(make_examples(5), IndexSampler(6, {}), collate_ids), Error);
  EXPECT_THROW(DataLoader<Ids>(make_examples(5), IndexSampler(5, {}), nullptr), Error);
  EXPECT_THROW(DataLoader<Ids>(make_examples(5), IndexSampler(5, {}), collate_ids, -1), Error);
  EXPECT_THROW(DataLoader<Ids>(std::shared_ptr<const Dataset>(), IndexSampler(5, {}), collate_ids), Error);
}

TEST(DataLoader, ShutdownWithAFullQueueOrABusyCollate) {
  const SamplerOptions infinite{.seed = 1, .num_epochs = kInfiniteEpochs, .batch_size = 2};
  std::atomic<int> calls{0};
  auto counting = [&](const std::vector<Example>& b) {
    ++calls;
    return collate_ids(b);
  };
  {
    DataLoader<Ids> loader(make_examples(10), IndexSampler(10, infinite), counting, 2);
    loader.next();
    // 1 consumed + 2 queued + 1 finished and waiting for space: then the producer blocks.
    EXPECT_TRUE(wait_for([&] { return calls == 4; }));
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(calls, 4) << "the queue is bounded";
  }
  EXPECT_EQ(calls, 4);
  { DataLoader<Ids> never_started(make_examples(10), IndexSampler(10, infinite), counting); }

  // Destroying while collate runs waits for that one call, then stops.
  std::atomic<bool> in_collate{false};
  const auto t0 = std::chrono::steady_clock::now();
  {
    DataLoader<Ids> loader(make_examples(10), IndexSampler(10, infinite),
                           [&](const std::vector<Example>& b) {
                             in_collate = true;
                             std::this_thread::sleep_for(50ms);
                             return collate_ids(b);
                           });
    loader.next();
    EXPECT_TRUE(wait_for([&] { return in_collate.load(); }));
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "  shutdown with a busy collate after " << ms << " ms\n";
  EXPECT_LT(ms, 5000);
}

TEST(DataLoader, CollateOverlapsTheConsumer) {
  // The consumer marks its "compute"; collate records whether it ever ran during it.
  std::atomic<bool> computing{false}, overlapped{false};
  DataLoader<Ids> loader(make_examples(40), IndexSampler(40, {.seed = 2, .batch_size = 4}),
                         [&](const std::vector<Example>& b) {
                           std::this_thread::sleep_for(5ms);
                           if (computing) overlapped = true;
                           return collate_ids(b);
                         });
  while (auto b = loader.next()) {
    computing = true;
    std::this_thread::sleep_for(10ms);
    computing = false;
  }
  EXPECT_TRUE(overlapped);
}

TEST(DataLoader, PackedTextToArraysOnTheBackgroundThread) {
  const auto docs = read_documents(std::string(MT_DATA_DIR) + "/text/tinystories_sample.txt");
  auto bytes = [](const std::string& s) {
    std::vector<int64_t> ids;
    for (unsigned char c : s) ids.push_back(c);
    return ids;
  };
  auto dataset = std::make_shared<PackedDataset>(docs, bytes, PackedDatasetOptions{.seq_len = 32, .separator_id = 0});
  struct XY {
    Array x, y;  // (B, T) inputs and next-token targets
  };
  auto collate = [](const std::vector<Example>& batch) {
    const int64_t b = int64_t(batch.size()), t = int64_t(batch[0].tokens("tokens").size()) - 1;
    std::vector<int64_t> x, y;
    for (const auto& ex : batch) {
      const auto& ids = ex.tokens("tokens");
      x.insert(x.end(), ids.begin(), ids.end() - 1);
      y.insert(y.end(), ids.begin() + 1, ids.end());
    }
    return XY{Array::from_vector(x, {b, t}), Array::from_vector(y, {b, t})};
  };
  DataLoader<XY> loader(dataset, IndexSampler(dataset->size(), {.seed = 5, .batch_size = 8}), collate);
  int64_t batches = 0;
  while (auto batch = loader.next()) {
    ASSERT_EQ(batch->data.x.shape(), (Shape{8, 32}));
    const auto x = batch->data.x.to_ints(), y = batch->data.y.to_ints();
    const auto first = dataset->get(batch->info.indices[0]).tokens("tokens");
    EXPECT_EQ(std::vector<int64_t>(x.begin(), x.begin() + 32), std::vector<int64_t>(first.begin(), first.end() - 1));
    EXPECT_EQ(std::vector<int64_t>(y.begin(), y.begin() + 32), std::vector<int64_t>(first.begin() + 1, first.end()));
    ++batches;
  }
  EXPECT_EQ(batches, dataset->size() / 8);
}

}  // namespace
}  // namespace mt::data
