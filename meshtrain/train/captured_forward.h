#pragma once
// A forward pass without gradients — the Trainer's eval step, the Predictor's predict step — as
// one captured CUDA graph per batch signature (issue 45), as CapturedSteps does for the
// training step. A forward changes
// no state, so a replay has no host half: the batch is copied into the graph's static inputs,
// the graph replayed and its outputs copied out (the next replay rewrites them, and an
// evaluation sums them over its batches). The graph reads the parameters at the addresses they
// had when it was captured; when they have moved since (a restore, or a precision policy's
// fresh casts at each evaluation) the shape is captured anew. A shape is captured once an eager
// run of it has read nothing to the host and uploaded nothing; one that cannot be runs eagerly,
// said once (CudaGraphs::automatic), or stops with the reason (CudaGraphs::on).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/ops/deferred_checks.h"
#include "meshtrain/train/captured_steps.h"

namespace mt::train {

// What one forward leaves for the host to read.
struct ForwardResults {
  Array loss;
  std::map<std::string, Array> metrics;  // what the loss function recorded (step_metrics.h)
  Batch outputs;                         // a predict step's named outputs
  std::vector<PendingCheck> checks;
  uint64_t host_reads = 0, host_uploads = 0;  // inside the forward
};

// Why no forward over `reads` may be captured in a run of `processes` processes ("" when it
// may): collectives, parameters off the GPU and sharded parameters are not captured.
std::string why_forward_cannot_be_captured(int processes, const Params& reads);
// The mode a run over `reads` uses: automatic is off when they are not on a GPU (nothing to
// capture on the CPU), silently.
CudaGraphs graphs_mode_for(CudaGraphs requested, const Params& reads);

class CapturedForward {
 public:
  using Run = std::function<ForwardResults(const Batch&)>;

  // `what`: what runs, for messages ("the eval step").
  CapturedForward(CudaGraphs mode, std::string what, CapturedSteps::Say say);
  ~CapturedForward();
  CapturedForward(const CapturedForward&) = delete;
  CapturedForward& operator=(const CapturedForward&) = delete;

  // As CapturedSteps::refuse_all: a reason no forward of this run may be captured.
  void refuse_all(const std::string& reason);
  // Runs `forward` on `batch`: eagerly, by capturing it or by replaying its shape's graph.
  // `reads`: the arrays it reads besides the batch (the parameters it computes with).
  ForwardResults run(const Batch& batch, const Params& reads, const Run& forward);
  int64_t replays() const { return replays_; }

 private:
  struct Graph;
  struct Shape;
  ForwardResults capture(const Batch& batch, const Run& forward, Shape& shape, const std::string& signature,
                         std::vector<const void*> addresses);
  ForwardResults replay(const Batch& batch, Graph& graph);
  void refuse(const std::string& reason);

  CudaGraphs mode_;
  std::string what_;
  CapturedSteps::Say say_;
  std::string refused_all_;
  std::map<std::string, std::unique_ptr<Shape>> shapes_;  // by batch_signature
  std::map<std::string, bool> said_;
  int64_t replays_ = 0;
};

}  // namespace mt::train
