#include "meshtrain/train/captured_forward.h"

#include <optional>
#include <utility>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/host_reads.h"
#include "meshtrain/core/trace.h"
#include "meshtrain/prim/dispatch.h"

namespace mt::train {

namespace {
const std::string kPrefix = "[cuda graphs] ";
// Eager runs of one shape allowed to show host traffic (the first runs make the buffers later
// ones reuse) before the shape is left eager for good.
constexpr int kUncleanRuns = 3;

ForwardResults copied(const ForwardResults& r) {
  ForwardResults out;
  out.loss = copy_out(r.loss);
  for (const auto& [name, a] : r.metrics) out.metrics[name] = copy_out(a);
  for (const auto& [name, a] : r.outputs) out.outputs.set(name, copy_out(a));
  out.checks = copy_out_checks(r.checks);
  return out;
}
}  // namespace

std::string why_forward_cannot_be_captured(int processes, const Params& reads) {
  if (processes > 1)
    return detail::concat("its results are reduced across ", processes, " processes (collectives are not captured)");
  for (const auto& [path, p] : reads) {
    if (!p.device().is_cuda()) return detail::concat("parameter '", path, "' is on ", p.device().str());
    if (p.distributed()) return detail::concat("parameter '", path, "' is sharded");
  }
  return "";
}

CudaGraphs graphs_mode_for(CudaGraphs requested, const Params& reads) {
  const bool on_gpu = !reads.empty() && reads.begin()->second.device().is_cuda();
  return requested == CudaGraphs::automatic && !on_gpu ? CudaGraphs::off : requested;
}

struct CapturedForward::Graph {
  // Destroyed last: the outputs' handles and the static inputs go first (their frees are
  // ordered on the stream after the last replay).
  std::unique_ptr<CapturedWork> work;
  Batch inputs;            // static: each batch is copied in
  ForwardResults outputs;  // the graph's own arrays, rewritten by every replay
  std::vector<const void*> addresses;  // of the arrays it reads besides the batch
  double model_flops = 0;
};

struct CapturedForward::Shape {
  bool clean_last = false;  // an eager run of this shape showed it capturable
  int unclean = 0;
  bool given_up = false;
  std::unique_ptr<Graph> graph;
};

CapturedForward::CapturedForward(CudaGraphs mode, std::string what, CapturedSteps::Say say)
    : mode_(mode), what_(std::move(what)), say_(std::move(say)) {}

CapturedForward::~CapturedForward() = default;

void CapturedForward::refuse(const std::string& reason) {
  if (mode_ == CudaGraphs::on)
    throw Error(kPrefix + "cannot capture " + what_ + ": " + reason + " (--cuda-graphs on; --cuda-graphs auto runs it eagerly)");
  if (said_.emplace(reason, true).second && say_) say_(kPrefix + what_ + " runs eagerly: " + reason);
}

void CapturedForward::refuse_all(const std::string& reason) {
  if (mode_ == CudaGraphs::off || reason.empty() || !refused_all_.empty()) return;
  refused_all_ = reason;
  refuse(reason);
}

ForwardResults CapturedForward::run(const Batch& batch, const Params& reads, const Run& forward) {
  if (mode_ == CudaGraphs::off) return forward(batch);
  if (!refused_all_.empty()) {
    if (mode_ == CudaGraphs::on) refuse(refused_all_);  // throws again
    return forward(batch);
  }
  const std::string signature = batch_signature({batch});
  std::unique_ptr<Shape>& slot = shapes_[signature];
  if (!slot) slot = std::make_unique<Shape>();
  Shape& shape = *slot;
  std::vector<const void*> addresses = device_addresses(reads);
  if (shape.graph && shape.graph->addresses == addresses) return replay(batch, *shape.graph);
  // Profiled kernels are timed with the queue drained around each: not recordable, and not
  // counted for or against the shape.
  if (prim::observing_ops()) return forward(batch);
  if (shape.graph) {
    // The parameters moved since the capture: this shape is known to capture, so at once.
    shape.graph.reset();
    return capture(batch, forward, shape, signature, std::move(addresses));
  }
  if (!shape.given_up && shape.clean_last) return capture(batch, forward, shape, signature, std::move(addresses));
  const uint64_t reads_before = host_read_count(), uploads_before = host_upload_count();
  ForwardResults r = forward(batch);
  r.host_reads = host_read_count() - reads_before;
  r.host_uploads = host_upload_count() - uploads_before;
  if (shape.given_up) return r;
  std::string reason;
  if (r.host_reads) reason = detail::concat("it reads ", r.host_reads, " values to the host");
  else if (r.host_uploads) reason = detail::concat("it uploads ", r.host_uploads, " host arrays after its batch");
  shape.clean_last = reason.empty();
  if (!reason.empty() && ++shape.unclean >= kUncleanRuns) {
    shape.given_up = true;
    refuse("batch " + signature + ": " + reason);
  }
  return r;
}

ForwardResults CapturedForward::capture(const Batch& batch, const Run& forward, Shape& shape,
                                        const std::string& signature, std::vector<const void*> addresses) {
  const uint64_t reads = host_read_count(), uploads = host_upload_count();
  auto graph = std::make_unique<Graph>();
  {
    autodiff::NoGradGuard no_grad;
    for (const auto& [name, a] : batch) graph->inputs.set(name, copy_out(a));
  }
  graph->addresses = std::move(addresses);
  ForwardResults recorded;
  std::optional<trace::Span> span;
  if (trace::enabled()) span.emplace("phase", "graph_capture");
  const double flops_before = prim::model_flops();
  try {
    graph->work = cuda_runtime().capture([&] { recorded = forward(graph->inputs); });
  } catch (const Error& e) {
    // Nothing was changed: the forward runs eagerly from now on.
    span.reset();
    recorded = ForwardResults{};
    shape.given_up = true;
    refuse("batch " + signature + ": " + without_graphs_prefix(e.what()));
    return forward(batch);
  }
  span.reset();
  graph->model_flops = prim::model_flops() - flops_before;
  graph->outputs = std::move(recorded);
  if (say_ && said_.emplace("captured " + signature, true).second)
    say_(detail::concat(kPrefix, "captured ", what_, " of batch ", signature, ": ", graph->work->nodes(), " nodes, ",
                        graph->work->kept_bytes() >> 20, " MiB of its own"));
  // Captured, not run: its first replay is this batch; a launch that fails (out of memory)
  // ran nothing, and the forward goes back to eager.
  try {
    graph->work->replay();
  } catch (const Error& e) {
    graph.reset();
    shape.given_up = true;
    refuse("batch " + signature + ": " + without_graphs_prefix(e.what()));
    return forward(batch);
  }
  shape.graph = std::move(graph);
  ++replays_;
  ForwardResults out = copied(shape.graph->outputs);
  out.host_reads = host_read_count() - reads;
  out.host_uploads = host_upload_count() - uploads;
  return out;
}

ForwardResults CapturedForward::replay(const Batch& batch, Graph& graph) {
  const uint64_t reads = host_read_count(), uploads = host_upload_count();
  autodiff::NoGradGuard no_grad;
  for (const auto& [name, a] : batch) copy_into(graph.inputs.at(name), a);
  std::optional<trace::Span> span;
  if (trace::enabled()) span.emplace("phase", "graph_replay");
  graph.work->replay();
  prim::count_model_flops(graph.model_flops);
  ++replays_;
  ForwardResults out = copied(graph.outputs);
  out.host_reads = host_read_count() - reads;
  out.host_uploads = host_upload_count() - uploads;
  return out;
}

}  // namespace mt::train
