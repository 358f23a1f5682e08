#pragma once
// One captured sequence of GPU work, replayed by one launch (a CUDA graph): what a training
// step becomes once it neither reads to the host nor uploads (core/host_reads.h), so that the
// host enqueues it in microseconds instead of launching its few hundred kernels one by one.
//
// Capture records what `record` enqueues on the process's stream; nothing runs until the first
// replay(). While it records:
//  - arrays it allocates become the graph's allocations (stream-ordered graph memory), freed
//    inside the graph when dropped inside it; those still held when it ends are the graph's
//    outputs: the caller's handles on them read each replay's values, until the next replay
//    rewrites them (the graph frees and reallocates them at the same addresses on relaunch);
//  - arrays made before it and dropped inside it are kept by the graph (its kernels read them
//    on every replay): they are its static inputs, rewritten in place between replays;
//  - a read to the host, an upload or a wait for the stream on the capturing thread throws,
//    naming it, and nothing of the capture remains; other threads' uploads and allocations
//    wait for the capture's end instead of joining it.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "meshtrain/core/device.h"

namespace mt::cuda {

class StepGraph final : public CapturedWork {
 public:
  // Throws mt::Error with the reason when the work cannot be captured.
  static std::unique_ptr<StepGraph> capture(const std::function<void()>& record);
  ~StepGraph() override;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  void replay() override;  // enqueues one run after the work already on the stream
  size_t nodes() const override { return nodes_; }
  size_t kept_bytes() const override { return kept_bytes_; }  // static inputs and outputs it owns

 private:
  StepGraph() = default;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
  size_t kept_bytes_ = 0;
  bool launched_ = false;
  std::vector<void*> outputs_;  // graph allocations alive at the capture's end
  std::vector<void*> inputs_;   // older allocations released during the capture
};

// True while the calling thread records a StepGraph.
bool capturing_on_this_thread();

}  // namespace mt::cuda
