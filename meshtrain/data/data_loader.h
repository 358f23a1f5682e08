#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/core/trace.h"
#include "meshtrain/data/dataset.h"
#include "meshtrain/data/index_sampler.h"

namespace mt::data {

// A collated batch with where it came from: epoch, batch index, the example indices and
// which slots are padding (a Predictor drops those outputs).
template <class Batch>
struct LoadedBatch {
  Batch data;
  SampledBatch info;
};

// "[DataLoader] collate failed on batch 3 of epoch 1 (examples 7, 2, ...): <what>".
std::string describe_batch_error(const char* stage, const SampledBatch& info, const std::string& what);

// Fetches and collates batches on a background thread, at most `prefetch` ready batches
// ahead of the consumer, so tokenization and collation overlap compute. prefetch = 0
// collates in next() on the caller's thread. The thread starts at the first next().
//
// state() is the sampler position of the next batch to be CONSUMED (batches prefetched
// but not returned are not counted), so a checkpoint resumes exactly where training was.
// An exception from get() or collate reaches the consumer, in order, as an mt::Error
// naming the batch; the loader then stays failed until restore().
template <class Batch>
class DataLoader {
 public:
  using CollateFn = std::function<Batch(const std::vector<Example>&)>;

  DataLoader(std::shared_ptr<const Dataset> dataset, IndexSampler sampler, CollateFn collate, int prefetch = 2)
      : dataset_(std::move(dataset)), consumer_(std::move(sampler)), collate_(std::move(collate)), prefetch_(prefetch) {
    MT_CHECK(dataset_ != nullptr, "[DataLoader] the dataset is null");
    MT_CHECK(collate_ != nullptr, "[DataLoader] the collate function is empty");
    MT_CHECK(prefetch_ >= 0, "[DataLoader] prefetch must be >= 0, got ", prefetch_);
    MT_CHECK(dataset_->size() == consumer_.num_examples(), "[DataLoader] the sampler is for ",
             consumer_.num_examples(), " examples but the dataset has ", dataset_->size());
  }
  DataLoader(std::vector<Example> examples, IndexSampler sampler, CollateFn collate, int prefetch = 2)
      : DataLoader(make_dataset(std::move(examples)), std::move(sampler), std::move(collate), prefetch) {}
  ~DataLoader() { stop(); }
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch, or nullopt after the sampler's last epoch. Blocks while the
  // background thread is still preparing it.
  std::optional<LoadedBatch<Batch>> next() {
    if (prefetch_ == 0) {
      const SamplerState before = consumer_.state();
      std::optional<SampledBatch> info = consumer_.next();
      if (!info) return std::nullopt;
      Item item = produce(std::move(*info));
      if (item.error) {
        consumer_.restore(before);  // a failed batch is not consumed
        std::rethrow_exception(item.error);
      }
      return std::move(item.batch);
    }
    if (!worker_.joinable()) start();
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !queue_.empty(); });
    Item& front = queue_.front();
    if (front.error) std::rethrow_exception(front.error);  // stays queued: the loader stays failed
    if (!front.batch) return std::nullopt;                  // end marker stays too
    Item item = std::move(front);
    queue_.pop_front();
    lock.unlock();
    space_.notify_one();
    consumer_.restore(item.after);
    return std::move(item.batch);
  }

  SamplerState state() const { return consumer_.state(); }

  // Moves to a saved position, discarding prefetched batches (and a pending error).
  void restore(const SamplerState& state) {
    stop();
    consumer_.restore(state);
  }

  // The sampler at the consumer's position (batch counts, options).
  const IndexSampler& sampler() const { return consumer_; }
  const Dataset& dataset() const { return *dataset_; }

  // Range-for support: `for (auto& batch : loader)` consumes batches until the end.
  class iterator {
   public:
    using value_type = LoadedBatch<Batch>;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(DataLoader* loader) : loader_(loader), current_(loader->next()) {}
    LoadedBatch<Batch>& operator*() { return *current_; }
    LoadedBatch<Batch>* operator->() { return &*current_; }
    iterator& operator++() {
      current_ = loader_->next();
      return *this;
    }
    bool operator==(const iterator& other) const { return !current_ && !other.current_; }

   private:
    DataLoader* loader_ = nullptr;
    std::optional<LoadedBatch<Batch>> current_;
  };
  iterator begin() { return iterator(this); }
  iterator end() { return iterator(); }

 private:
  struct Item {
    std::optional<LoadedBatch<Batch>> batch;  // empty with no error: the end marker
    std::exception_ptr error;
    SamplerState after;                       // sampler position once this batch is consumed
  };

  Item produce(SampledBatch info) const {
    Item item;
    std::vector<Example> examples;
    examples.reserve(info.indices.size());
    const char* stage = "reading examples";
    std::optional<trace::Span> span;  // on the loader's thread when it prefetches
    if (trace::enabled()) span.emplace("data", "load_batch", trace::arg("examples", double(info.indices.size())));
    try {
      for (int64_t index : info.indices) examples.push_back(dataset_->get(index));
      stage = "collate";
      Batch batch = collate_(examples);
      item.batch.emplace(LoadedBatch<Batch>{std::move(batch), std::move(info)});
    } catch (const std::exception& e) {
      item.error = std::make_exception_ptr(Error(describe_batch_error(stage, info, e.what())));
    } catch (...) {
      item.error = std::make_exception_ptr(Error(describe_batch_error(stage, info, "unknown exception")));
    }
    return item;
  }

  void start() {
    queue_.clear();
    stopping_ = false;
    worker_ = std::thread([this, sampler = consumer_]() mutable { run(std::move(sampler)); });
  }

  void run(IndexSampler sampler) {
    trace::name_this_thread("data loader");
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) return;
      }
      std::optional<SampledBatch> info = sampler.next();
      Item item = info ? produce(std::move(*info)) : Item{};
      item.after = sampler.state();
      const bool last = !item.batch;  // the end marker or an error ends the thread
      {
        std::unique_lock<std::mutex> lock(mutex_);
        space_.wait(lock, [&] { return stopping_ || int(queue_.size()) < prefetch_; });
        if (stopping_) return;
        queue_.push_back(std::move(item));
      }
      ready_.notify_one();
      if (last) return;
    }
  }

  void stop() {
    if (!worker_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    space_.notify_all();
    worker_.join();
    queue_.clear();
  }

  std::shared_ptr<const Dataset> dataset_;
  IndexSampler consumer_;
  CollateFn collate_;
  int prefetch_;

  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable ready_, space_;
  std::deque<Item> queue_;
  bool stopping_ = false;
};

}  // namespace mt::data
