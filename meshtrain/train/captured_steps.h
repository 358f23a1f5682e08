#pragma once
// The Trainer's default step as one captured CUDA graph per batch shape (issue 45), replayed
// instead of enqueued kernel by kernel: the host then spends microseconds per step where it
// spent the launches of a few hundred kernels.
//
// A shape's step is captured once an eager step of that shape has shown it capturable: no
// read to the host and no upload between its batch and its loss (core/host_reads.h), and the
// parameters and optimizer state rewritten in place (a graph reads and writes fixed addresses;
// a state replaced by new arrays would leave every replay updating the old ones). Before the
// capture and before each replay the host does the step's host half: the batch copied into
// the graph's static inputs, the step written into the key's device scalar (the Trainer) and
// the optimizer's host_step (its counters and the device values its launches read). After
// each replay the losses, metrics and check verdicts are copied out, since the next replay
// rewrites them while the Trainer reads steps several at a time.
//
// When a step cannot be captured the run says why (once per reason) and goes on eagerly
// (CudaGraphs::automatic), or stops with the reason (CudaGraphs::on). While another handle
// than the trainer's holds the state (an eager update would then not write it in place) steps
// run eagerly. A captured update that replaced the state after all runs once and its state is
// copied out of the graph; a capture that fails after the step began updating the state (which
// no rehearsal foresaw) leaves the trainer broken, as a failed deferred check does.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/core/device.h"
#include "meshtrain/ops/deferred_checks.h"
#include "meshtrain/optim/transform.h"
#include "meshtrain/train/deployer.h"
#include "meshtrain/train/step_metrics.h"

namespace mt::train {

enum class CudaGraphs { off, automatic, on };
// "auto", "on" or "off"; throws naming the text otherwise.
CudaGraphs parse_cuda_graphs(const std::string& text);
std::string to_string(CudaGraphs mode);

// What one run of the default step leaves for the host to read.
struct StepResults {
  std::vector<Array> losses;  // per micro-batch
  MetricMeans metrics;
  std::vector<PendingCheck> checks;
  uint64_t host_reads = 0, host_uploads = 0;  // inside the step
};

// "input_ids:i64(8, 128) labels:i64(8) | ..." per micro-batch: a graph serves one signature.
std::string batch_signature(const std::vector<Batch>& micro_batches);

// A copy on the device, in the same layout, that outlives the next replay of the graph that
// wrote `a` (undefined stays undefined).
Array copy_out(const Array& a);
// Index checks whose verdicts and indices are copied out of a graph's arrays (rewritten by its
// next replay), each array as copy_out copies it.
std::vector<PendingCheck> copy_out_checks(const std::vector<PendingCheck>& checks);
// Writes `source` into `target` (a graph's static input) in place, shard by shard.
void copy_into(const Array& target, const Array& source);
// The device buffers of `tree`'s arrays, in order: a graph reads them at these addresses.
std::vector<const void*> device_addresses(const Params& tree);
// A "[cuda graphs] ..." message without its prefix, to quote inside another.
std::string without_graphs_prefix(const std::string& text);

class CapturedSteps {
 public:
  // Enqueues one default step on these micro-batches (eagerly, or recorded while capturing).
  using RunStep = std::function<StepResults(const std::vector<Batch>&)>;
  // Prints a line (rank 0, above the progress bar).
  using Say = std::function<void(const std::string&)>;

  CapturedSteps(CudaGraphs mode, Params& params, Params& opt_state, const optim::Transform& optimizer, RunStep run,
                Say say);
  ~CapturedSteps();
  CapturedSteps(const CapturedSteps&) = delete;
  CapturedSteps& operator=(const CapturedSteps&) = delete;

  // Why no step of this run may be captured ("" when steps may be): the Trainer's reasons
  // (several processes, a custom step, an optimizer without host_step, a CPU device). Under
  // CudaGraphs::on a reason is an error; under automatic it is said once.
  void refuse_all(const std::string& reason);
  // Runs step `step` (its number, from 1, for messages): eagerly, by capturing it, or by
  // replaying its shape's graph. Throws as the step would; after a failed capture that had
  // touched the state, throws with `broken` set.
  StepResults run(const std::vector<Batch>& micro_batches, int64_t step);
  // Set when a capture failed after the step began rewriting the state (see above).
  const std::string& broken() const { return broken_; }
  int64_t replays() const { return replays_; }

 private:
  struct Graph;
  struct Shape;
  StepResults run_eagerly(const std::vector<Batch>& micro_batches, Shape& shape);
  // `addresses`: state().addresses before the step.
  StepResults capture(const std::vector<Batch>& micro_batches, Shape& shape, const std::string& signature,
                      int64_t step, std::vector<const void*> addresses);
  StepResults replay(const std::vector<Batch>& micro_batches, Graph& graph);
  // Under automatic: says it once per reason; under on: throws, breaking the trainer when the
  // step was applied eagerly first.
  void refuse(const std::string& what, const std::string& reason, bool step_applied);
  // The device buffers of the parameters and the optimizer state, in order, and whether the
  // trainer's handles are the only ones on them (an eager update then rewrites them in place,
  // as a replay does). One pass: it runs before every step.
  struct State {
    std::vector<const void*> addresses;
    bool sole = true;
  };
  State state() const;

  CudaGraphs mode_;
  Params& params_;
  Params& opt_state_;
  const optim::Transform& optimizer_;
  RunStep run_;
  Say say_;
  std::string refused_all_;
  std::map<std::string, std::unique_ptr<Shape>> shapes_;  // by batch_signature
  std::map<std::string, bool> said_;
  std::string broken_;
  int64_t replays_ = 0;
};

}  // namespace mt::train
