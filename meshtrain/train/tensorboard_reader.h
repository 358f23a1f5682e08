#pragma once
// Reads TensorBoard event files back (TFRecord framing, both CRCs checked, Event protos
// decoded): for tests and for tools that summarize a run without TensorBoard.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mt::train {

struct TensorBoardEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                               // set on the first event only
  std::vector<std::pair<std::string, float>> scalars;  // (tag, simple_value)
};

// Every event of one file, in order. Throws mt::Error naming the file and byte offset on a
// truncated record, a length or data CRC mismatch, or malformed protobuf.
std::vector<TensorBoardEvent> read_tensorboard_events(const std::string& path);

}  // namespace mt::train
