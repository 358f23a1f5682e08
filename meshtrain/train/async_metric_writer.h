#pragma once
// Logging that never stalls the training step (the cookbook's record-writer idea): the
// training thread pushes step N's metrics, possibly still as Arrays, and a background
// thread reads them (.item()) and forwards them to the sinks while step N+1 runs.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "meshtrain/core/array.h"
#include "meshtrain/train/metric_sink.h"

namespace mt::train {

using MetricValue = std::variant<double, Array>;  // an Array must hold one element

struct MetricRecord {
  int64_t step = 0;
  std::string split = "train";
  std::map<std::string, MetricValue> values{};
};

class AsyncMetricWriter {
 public:
  explicit AsyncMetricWriter(std::vector<std::shared_ptr<MetricSink>> sinks);
  // Drains the queue, flushes the sinks and joins the thread (errors are swallowed here;
  // call close() to see them).
  ~AsyncMetricWriter();
  AsyncMetricWriter(const AsyncMetricWriter&) = delete;
  AsyncMetricWriter& operator=(const AsyncMetricWriter&) = delete;

  // Queues the record and returns at once (the queue is unbounded; records are small).
  // Arrays are detached here; a sharded Array that is not replicated is gathered here
  // (dist::to_host, a collective every rank runs in the same order), replicated ones are
  // read from the local block on the writer thread. Rethrows a sink's earlier failure.
  void push(MetricRecord record);
  void push(int64_t step, const std::string& split, std::map<std::string, MetricValue> values);
  // Blocks until everything pushed so far reached every sink, then flushes the sinks.
  void flush();
  // flush(), then stops the thread; later pushes throw. Rethrows a sink's failure.
  void close();
  // Records pushed but not yet handed to every sink.
  size_t pending() const;

 private:
  void run();
  void rethrow_locked();

  std::vector<std::shared_ptr<MetricSink>> sinks_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<MetricRecord> queue_;
  size_t in_flight_ = 0;  // popped, not yet written
  // flush() takes ticket ++flush_requests_ and waits until flushes_done_ reaches it; the
  // thread serves all tickets issued before it saw an empty queue with one sink flush.
  uint64_t flush_requests_ = 0;
  uint64_t flushes_done_ = 0;
  bool stop_ = false;
  bool closed_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace mt::train
