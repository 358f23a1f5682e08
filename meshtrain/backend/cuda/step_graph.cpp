#include "meshtrain/backend/cuda/step_graph.h"

#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/step_graph_hooks.h"
#include "meshtrain/core/error.h"

namespace mt::cuda {

std::unique_ptr<StepGraph> StepGraph::capture(const std::function<void()>& record) {
  capture_hooks::begin();
  try {
    record();
  } catch (...) {
    capture_hooks::Ended ended = capture_hooks::end(false);
    if (ended.graph) cudaGraphDestroy(ended.graph);
    throw;
  }
  capture_hooks::Ended ended = capture_hooks::end(true);
  if (!ended.graph) {
    capture_hooks::release({}, ended.inputs, false);
    throw Error("[cuda graphs] the driver refused the capture: " + ended.error);
  }
  std::unique_ptr<StepGraph> g(new StepGraph());
  g->graph_ = ended.graph;
  g->outputs_ = std::move(ended.outputs);
  g->inputs_ = std::move(ended.inputs);
  g->kept_bytes_ = ended.bytes;
  size_t nodes = 0;
  if (cudaGraphGetNodes(g->graph_, nullptr, &nodes) != cudaSuccess) cudaGetLastError();
  g->nodes_ = nodes;
  // Auto-free on launch: a replay first frees the outputs the previous one left (the caller has
  // read them by then: the stream orders it) and allocates them again at the same addresses.
  const cudaError_t e = cudaGraphInstantiateWithFlags(&g->exec_, g->graph_, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  if (e != cudaSuccess) {
    cudaGetLastError();
    g->exec_ = nullptr;
    throw Error(detail::concat("[cuda graphs] cannot instantiate the captured step (", g->nodes_, " nodes): ",
                               cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
  }
  // Its memory mapped now, where a failure (out of memory) still leaves the step to run
  // eagerly, rather than at the first launch.
  const cudaError_t up = cudaGraphUpload(g->exec_, stream());
  if (up != cudaSuccess) {
    cudaGetLastError();
    throw Error(detail::concat("[cuda graphs] cannot map the captured step's ", g->kept_bytes_ >> 20,
                               " MiB and its activations: ", cudaGetErrorName(up), " (", cudaGetErrorString(up), ")"));
  }
  return g;
}

void StepGraph::replay() {
  check(cudaGraphLaunch(exec_, stream()), "cudaGraphLaunch");
  launched_ = true;
}

StepGraph::~StepGraph() {
  capture_hooks::release(outputs_, inputs_, launched_);
  if (cudaStreamSynchronize(stream()) != cudaSuccess) cudaGetLastError();  // the last replay done
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  // Graph memory stays reserved after its graph is gone until trimmed: a recapture (a new
  // batch shape, the eval step) would otherwise hold the old graph's activations too.
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGraphMemTrim(device);
  cudaGetLastError();  // nothing left for the next launch check
}

bool capturing_on_this_thread() { return capture_hooks::capturing_on_this_thread(); }

}  // namespace mt::cuda
