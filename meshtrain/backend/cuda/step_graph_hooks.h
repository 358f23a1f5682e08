#pragma once
// What StepGraph (step_graph.h) needs from the runtime (device_runtime.cpp), which owns the
// stream, the allocator and the capture state they share.
#include <string>
#include <vector>

#include <cuda_runtime.h>

namespace mt::cuda::capture_hooks {

// Starts recording the calling thread's work on the stream.
void begin();

struct Ended {
  cudaGraph_t graph = nullptr;  // null when the driver refused the capture
  std::string error;            // the driver's reason then
  std::vector<void*> outputs;   // graph allocations still held by arrays
  std::vector<void*> inputs;    // older allocations released during the capture (kept when `keep`)
  size_t bytes = 0;
};
// Stops recording. keep = false gives the capture up: older memory released meanwhile is freed
// at once (nothing recorded will run).
Ended end(bool keep);
// Frees what a graph kept, after its last replay (launched: it ran at least once, so its
// outputs exist).
void release(const std::vector<void*>& outputs, const std::vector<void*>& inputs, bool launched);
bool capturing_on_this_thread();

}  // namespace mt::cuda::capture_hooks
