#include "meshtrain/train/async_metric_writer.h"

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/sharding.h"
#include "meshtrain/distributed/spmd.h"

namespace mt::train {

AsyncMetricWriter::AsyncMetricWriter(std::vector<std::shared_ptr<MetricSink>> sinks) : sinks_(std::move(sinks)) {
  for (size_t i = 0; i < sinks_.size(); ++i) MT_CHECK(sinks_[i] != nullptr, "[AsyncMetricWriter] sink ", i, " is null");
  thread_ = std::thread([this] { run(); });
}

AsyncMetricWriter::~AsyncMetricWriter() {
  try {
    close();
  } catch (...) {
    // A destructor must not throw; close() reports sink errors to callers who ask.
  }
}

void AsyncMetricWriter::rethrow_locked() {
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;  // reported once
    std::rethrow_exception(e);
  }
}

void AsyncMetricWriter::push(int64_t step, const std::string& split, std::map<std::string, MetricValue> values) {
  push(MetricRecord{step, split, std::move(values)});
}

void AsyncMetricWriter::push(MetricRecord record) {
  for (auto& [name, value] : record.values) {
    if (auto* a = std::get_if<Array>(&value)) {
      MT_CHECK(a->defined() && a->numel() == 1, "[AsyncMetricWriter] metric '", name, "' at step ", record.step,
               " must be a one-element Array, got ", a->defined() ? a->str() : std::string("an undefined Array"));
      // Dropping the autodiff history here keeps the step's graph from living on in the
      // queue. Collectives must stay on the training thread, in program order on all ranks.
      Array v = a->detach();
      if (v.sharded()) v = !v.distributed() ? dist::local_view(v).detach() : dist::to_host(v);
      value = v;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  rethrow_locked();
  MT_CHECK(!closed_, "[AsyncMetricWriter] push of step ", record.step, " after close()");
  queue_.push_back(std::move(record));
  work_cv_.notify_one();
}

void AsyncMetricWriter::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!closed_) {  // after close() the thread has drained and flushed everything
    uint64_t target = ++flush_requests_;
    work_cv_.notify_one();
    idle_cv_.wait(lock, [&] { return flushes_done_ >= target; });
  }
  rethrow_locked();
}

void AsyncMetricWriter::close() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) {
      rethrow_locked();
      return;
    }
    closed_ = true;
    stop_ = true;
    work_cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  rethrow_locked();
}

size_t AsyncMetricWriter::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + in_flight_;
}

void AsyncMetricWriter::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return !queue_.empty() || flush_requests_ > flushes_done_ || stop_; });
    while (!queue_.empty()) {
      MetricRecord rec = std::move(queue_.front());
      queue_.pop_front();
      in_flight_ = 1;
      lock.unlock();
      try {
        ScalarRecord out{rec.step, rec.split, {}};
        for (const auto& [name, value] : rec.values)
          out.values[name] = std::holds_alternative<double>(value) ? std::get<double>(value) : std::get<Array>(value).item();
        rec.values.clear();  // release the Arrays before the (maybe slow) sinks run
        for (auto& sink : sinks_) sink->write(out);
      } catch (...) {
        lock.lock();
        if (!error_) error_ = std::current_exception();
        lock.unlock();
      }
      lock.lock();
      in_flight_ = 0;
    }
    // The queue is empty, so every record pushed before the tickets issued so far is written:
    // one sink flush serves them all (and the final drain on stop).
    if (flush_requests_ > flushes_done_ || stop_) {
      uint64_t serving = flush_requests_;
      lock.unlock();
      try {
        for (auto& sink : sinks_) sink->flush();
      } catch (...) {
        lock.lock();
        if (!error_) error_ = std::current_exception();
        lock.unlock();
      }
      lock.lock();
      flushes_done_ = serving;
      idle_cv_.notify_all();
      if (stop_ && queue_.empty()) return;
    }
  }
}

}  // namespace mt::train
