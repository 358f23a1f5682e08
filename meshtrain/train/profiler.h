#pragma once
// --profile START:END: records the steps START..END (inclusive, numbered from 1 as in
// metrics.jsonl) of a training run and writes, under the run's profile/ directory:
//   trace.json  Chrome trace-event format (Perfetto UI, chrome://tracing): one process per rank,
//               thread tracks for compute, communication and the data loader; spans for every
//               op kernel, every VJP (named after its forward op), collectives, communication
//               waits, data waits, batch assembly, the optimizer, checkpoints and evaluation;
//               live-allocator and RSS counters; on a GPU, a track of the device's own timings
//               of every kernel, copy and fill (CUPTI; graph replays' nodes included).
//   ops.txt / ops.json  time by op (forward and backward apart), collectives, and a one-line
//               step breakdown; on a GPU, the device's busy share and its time by kernel name
//               and count; ops.txt is also printed at the end of the profiled steps.
// Under mpirun every rank records its part; rank 0 merges them on a common time base (a barrier
// when recording starts).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/core/trace.h"
#include "meshtrain/prim/dispatch.h"

namespace mt::train {

struct ProfileRange {
  int64_t first = 0, last = 0;  // optimizer steps, from 1, inclusive
  // "10:12" (or "7" for one step); throws naming the text for anything else.
  static ProfileRange parse(const std::string& text);
};

// The op profile of a recording (this rank's events).
struct OpRow {
  std::string name;
  std::string phase;  // "forward", "backward" or "collective"
  std::string dtype;  // the kernel's output dtype (mixed precision shows which ran in bf16)
  std::string kind;   // ops: prim::OpKind's name ("gemm", "attention", "other")
  int64_t calls = 0;
  double total_ms = 0;
  double flops = 0;  // summed over calls (ops); 0 when not counted
  double bytes = 0;  // collectives: bytes sent per rank
};
struct OpProfile {
  int64_t steps = 0;
  double step_ms = 0;  // summed wall time of the profiled steps
  std::vector<OpRow> rows;  // by total time, longest first
  // Step breakdown (% of step_ms): gemm, attention, elementwise_norm, optimizer,
  // communication_exposed, data_wait, other.
  std::vector<std::pair<std::string, double>> breakdown;
};
OpProfile summarize(const trace::Recording& recording);
// The op observer the profiler installs: each kernel call becomes an "op" span (or
// "op_backward" inside a VJP) with its shapes, FLOPs and bytes.
void record_op_span(const prim::OpEvent& event);
std::string format_op_table(const OpProfile& profile);

class Profiler {
 public:
  // Checks the range against the steps this run will take (after `done_steps` already taken,
  // up to `total_steps`): an error before training starts.
  // `print` shows the op table (rank 0) when the range ends.
  Profiler(ProfileRange range, int64_t done_steps, int64_t total_steps, std::string dir,
           std::function<void(const std::string&)> print);
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Around each optimizer step; `step` is the number the step has (1 for the first).
  void step_begin(int64_t step);
  void step_end(int64_t step);
  // Writes what was recorded if the run ended inside the range (collective).
  void finish();
  bool recording() const { return recording_; }

 private:
  void start();

  ProfileRange range_;
  std::string dir_;
  std::function<void(const std::string&)> print_;
  bool recording_ = false;
  bool device_trace_ = false;  // the GPU's own timings are on (train/device_profile.h)
  std::optional<trace::Span> step_span_;
};

}  // namespace mt::train
