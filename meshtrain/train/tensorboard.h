#pragma once
// TensorBoard event files written by hand: TFRecord framing around Event protos holding
// scalar summaries, readable by `tensorboard --logdir <dir>`.
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include "meshtrain/train/metric_sink.h"

namespace mt::train {

class TensorBoardWriter : public MetricSink {
 public:
  // Creates `log_dir` (and parents) and a new file events.out.tfevents.<unix seconds>.<host>
  // in it (".<pid>.<n>" is appended if that name is taken, e.g. two writers in one second).
  // The first record is the "brain.Event:2" version event. Throws mt::Error on I/O failure.
  explicit TensorBoardWriter(const std::string& log_dir);
  ~TensorBoardWriter() override;
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event with a single simple_value (stored as float32, as TensorBoard does).
  void scalar(const std::string& tag, double value, int64_t step);
  // Makes everything written so far visible to readers.
  void flush() override;
  // One Event per record holding every value, tagged "<split>/<name>" ("train/loss").
  void write(const ScalarRecord& record) override;

  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event_bytes);

  std::mutex mu_;
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mt::train
