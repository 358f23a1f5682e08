#include "meshtrain/train/captured_steps.h"

#include <optional>
#include <utility>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/host_reads.h"
#include "meshtrain/core/trace.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/prim/dispatch.h"

namespace mt::train {

CudaGraphs parse_cuda_graphs(const std::string& text) {
  if (text == "auto") return CudaGraphs::automatic;
  if (text == "on") return CudaGraphs::on;
  if (text == "off") return CudaGraphs::off;
  throw Error("[cuda graphs] expected auto, on or off, got '" + text + "'");
}

std::string to_string(CudaGraphs mode) {
  switch (mode) {
    case CudaGraphs::off: return "off";
    case CudaGraphs::automatic: return "auto";
    case CudaGraphs::on: return "on";
  }
  return "?";
}

namespace {

const dist::Sharding* layout_of(const Array& a) { return a.sharded() ? dist::sharding_of(a) : nullptr; }

StepResults copied(const StepResults& r) {
  StepResults out;
  for (const Array& l : r.losses) out.losses.push_back(copy_out(l));
  out.metrics = r.metrics.transformed(copy_out);
  out.checks = copy_out_checks(r.checks);
  return out;
}

}  // namespace

Array copy_out(const Array& a) {
  if (!a.defined()) return a;
  if (const dist::Sharding* s = layout_of(a)) return dist::global_view(dist::local_view(a).detach().clone(), *s);
  return a.clone();
}

std::vector<PendingCheck> copy_out_checks(const std::vector<PendingCheck>& checks) {
  std::vector<PendingCheck> out;
  for (PendingCheck c : checks) {
    c.first = copy_out(c.first);
    c.indices = copy_out(c.indices);
    out.push_back(std::move(c));
  }
  return out;
}

void copy_into(const Array& target, const Array& source) {
  if (target.sharded())
    dist::local_view(target).detach().copy_from(dist::local_view(source).detach());
  else
    target.copy_from(source);
}

namespace {
const void* device_address(const Array& a) { return a.sharded() ? dist::local_view(a).raw() : a.raw(); }
}  // namespace

std::vector<const void*> device_addresses(const Params& tree) {
  std::vector<const void*> out;
  for (const auto& [path, a] : tree)
    if (a.defined() && !a.device().is_cpu()) out.push_back(device_address(a));
  return out;
}

std::string batch_signature(const std::vector<Batch>& micro_batches) {
  std::string s;
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    if (m) s += " | ";
    bool first = true;
    for (const auto& [name, a] : micro_batches[m]) {
      if (!first) s += ' ';
      s.append(name).append(":").append(a.str()).append("@").append(a.device().str());
      if (const dist::Sharding* l = layout_of(a)) s.append(" ").append(l->str());
      first = false;
    }
  }
  return s;
}

struct CapturedSteps::Graph {
  // Destroyed last: the outputs' handles and the static inputs go first (their frees are
  // ordered on the stream after the last replay).
  std::unique_ptr<CapturedWork> work;
  std::vector<Batch> inputs;  // static: each step's batch is copied in
  StepResults outputs;        // the graph's own arrays, rewritten by every replay
  std::vector<const void*> addresses;  // state().addresses when captured
  double model_flops = 0;  // counted while recording: a replay enqueues no primitive to count them
};

struct CapturedSteps::Shape {
  bool clean_last = false;  // the last eager step of this shape showed it capturable
  int unclean = 0;          // eager steps that did not
  bool given_up = false;
  std::unique_ptr<Graph> graph;
};

namespace {
// Eager steps of one shape allowed to show host traffic (the first steps make the buffers
// later ones reuse) before its step is left eager for good.
constexpr int kUncleanSteps = 3;
// Graphs kept at most: each holds its step's activations and static inputs. Batches padded to
// their longest row come in a few widths, but a width per micro-batch under gradient
// accumulation multiplies them; shapes beyond this many run eagerly.
constexpr size_t kMaxGraphs = 16;
// Every line this file says or throws starts so; a runtime refusal's reason already does.
const std::string kPrefix = "[cuda graphs] ";
}  // namespace

std::string without_graphs_prefix(const std::string& text) {
  return text.compare(0, kPrefix.size(), kPrefix) == 0 ? text.substr(kPrefix.size()) : text;
}

CapturedSteps::CapturedSteps(CudaGraphs mode, Params& params, Params& opt_state, const optim::Transform& optimizer,
                             RunStep run, Say say)
    : mode_(mode), params_(params), opt_state_(opt_state), optimizer_(optimizer), run_(std::move(run)),
      say_(std::move(say)) {}

CapturedSteps::~CapturedSteps() = default;

void CapturedSteps::refuse(const std::string& what, const std::string& reason, bool step_applied) {
  if (mode_ == CudaGraphs::on) {
    const std::string line = "cannot capture " + what + ": " + reason +
                             " (--cuda-graphs on; --cuda-graphs auto runs it eagerly)";
    // Found after an eager step had updated the state: it is then no counted step's.
    if (step_applied) broken_ = line + "; its update was applied";
    throw Error(kPrefix + line);
  }
  if (said_.emplace(reason, true).second && say_) say_(kPrefix + what + " runs eagerly: " + reason);
}

void CapturedSteps::refuse_all(const std::string& reason) {
  if (mode_ == CudaGraphs::off || reason.empty() || !refused_all_.empty()) return;
  refused_all_ = reason;
  refuse("the training step", reason, false);
}

CapturedSteps::State CapturedSteps::state() const {
  State out;
  // Grouped by buffer for the ownership test: Adam's moments are views of one flat buffer,
  // which the views alone hold.
  std::map<const void*, std::vector<const Array*>> by_buffer;
  for (const Params* tree : {&params_, &opt_state_})
    for (const auto& [path, a] : *tree)
      if (a.defined() && !a.device().is_cpu()) {
        out.addresses.push_back(device_address(a));
        by_buffer[a.impl()->storage.get()].push_back(&a);
      }
  for (const auto& [buffer, handles] : by_buffer) out.sole = out.sole && Array::sole_owners(handles);
  return out;
}

StepResults CapturedSteps::run(const std::vector<Batch>& micro_batches, int64_t step) {
  MT_CHECK(broken_.empty(), "[cuda graphs] ", broken_);
  if (mode_ == CudaGraphs::off) return run_(micro_batches);
  if (!refused_all_.empty()) {
    if (mode_ == CudaGraphs::on) refuse("the training step", refused_all_, false);  // throws again
    return run_(micro_batches);
  }
  const std::string signature = batch_signature(micro_batches);
  std::unique_ptr<Shape>& slot = shapes_[signature];
  if (!slot) slot = std::make_unique<Shape>();
  Shape& shape = *slot;
  // An eager update writes in place only what the trainer alone holds; a replay always does.
  // With another handle on the state (a copy kept by the caller or an on_step hook) the step
  // runs eagerly, as it would without graphs.
  const State now = state();
  if (shape.graph && shape.graph->addresses != now.addresses) {
    // The state was replaced since the capture (a restore): capture anew.
    shape.graph.reset();
    shape.clean_last = false;
  }
  if (!now.sole) {
    // Not held against the shape: the holder may let go by the next step.
    shape.clean_last = false;
    // Said when it keeps a graph from replaying (before, the first steps' state is often still
    // shared with the arrays it was loaded from, and the eager update then replaces it).
    if (shape.graph && said_.emplace("shared state", true).second && say_)
      say_("[cuda graphs] steps run eagerly while another handle than the trainer's holds its parameters or "
           "optimizer state (a copy kept across steps)");
    return run_(micro_batches);
  }
  if (shape.graph) return replay(micro_batches, *shape.graph);
  // A profiled step drains the queue around each kernel, which no capture can record: its
  // steps run eagerly, neither showing the shape capturable nor counting against it.
  if (prim::observing_ops()) return run_(micro_batches);
  if (shape.given_up || !shape.clean_last) return run_eagerly(micro_batches, shape);
  size_t graphs = 0;
  for (const auto& [sig, s] : shapes_) graphs += s && s->graph ? 1 : 0;
  if (graphs >= kMaxGraphs) {
    if (said_.emplace("graph limit", true).second && say_)
      say_(detail::concat(kPrefix, "the steps of batch shapes after the first ", kMaxGraphs,
                          " captured run eagerly (pad batches to fewer lengths: a larger --pad-to-multiple-of, or "
                          "--pad-to-max-length)"));
    return run_(micro_batches);
  }
  return capture(micro_batches, shape, signature, step, now.addresses);
}

StepResults CapturedSteps::run_eagerly(const std::vector<Batch>& micro_batches, Shape& shape) {
  const std::vector<const void*> before = state().addresses;
  StepResults r = run_(micro_batches);
  if (shape.given_up) return r;
  std::string reason;
  if (r.host_reads) reason = detail::concat("its step reads ", r.host_reads, " values to the host");
  else if (r.host_uploads) reason = detail::concat("its step uploads ", r.host_uploads, " host arrays after its batch");
  else if (state().addresses != before)
    reason = "its update replaced parameters or optimizer state instead of rewriting them in place";
  shape.clean_last = reason.empty();
  if (!reason.empty() && ++shape.unclean >= kUncleanSteps) {
    shape.given_up = true;
    refuse("the step of batch " + batch_signature(micro_batches), reason, true);
  }
  return r;
}

StepResults CapturedSteps::capture(const std::vector<Batch>& micro_batches, Shape& shape,
                                   const std::string& signature, int64_t step,
                                   std::vector<const void*> addresses) {
  const uint64_t reads = host_read_count(), uploads = host_upload_count();
  auto graph = std::make_unique<Graph>();
  {
    autodiff::NoGradGuard no_grad;
    for (const Batch& b : micro_batches) {
      Batch copy;
      for (const auto& [name, a] : b) copy.set(name, copy_out(a));
      graph->inputs.push_back(std::move(copy));
    }
  }
  graph->addresses = std::move(addresses);
  // The host counters as they were: a capture given up did not step, so they go back.
  Params counters;
  for (const auto& [path, a] : opt_state_)
    if (a.defined() && a.device().is_cpu()) counters.set(path, a);
  optimizer_.host_step(opt_state_);
  StepResults recorded;
  std::optional<trace::Span> span;
  if (trace::enabled()) span.emplace("phase", "graph_capture");
  const double flops_before = prim::model_flops();
  try {
    graph->work = cuda_runtime().capture([&] { recorded = run_(graph->inputs); });
  } catch (const Error& e) {
    span.reset();
    recorded = StepResults{};
    for (const auto& [path, a] : counters) opt_state_.set(path, a);
    if (state().addresses != graph->addresses) {
      // The update had begun replacing the state with arrays of the capture, which never ran.
      broken_ = detail::concat("capturing step ", step, " failed after its update had replaced the state (", e.what(),
                               "); the parameters are no step's — resume from the last checkpoint with "
                               "--cuda-graphs off");
      throw Error("[trainer] " + broken_);
    }
    shape.given_up = true;
    refuse("the step of batch " + signature, without_graphs_prefix(e.what()), false);
    return run_(micro_batches);
  }
  graph->model_flops = prim::model_flops() - flops_before;
  if (state().addresses != graph->addresses) {
    // Captured, but the update replaced the state with the graph's own arrays, which every
    // replay would write from the old state again. This step is still right: it runs once,
    // its new state is copied out of the graph, and the shape stays eager.
    graph->work->replay();
    for (Params* tree : {&params_, &opt_state_})
      for (auto& [path, a] : *tree)
        if (a.defined() && !a.device().is_cpu()) a = copy_out(a);
    StepResults out = copied(recorded);
    recorded = StepResults{};
    graph.reset();
    shape.given_up = true;
    refuse("the step of batch " + signature,
           "its update replaced parameters or optimizer state instead of rewriting them in place", true);
    return out;
  }
  graph->outputs = std::move(recorded);
  if (say_)
    say_(detail::concat("[cuda graphs] captured the step of batch ", signature, ": ", graph->work->nodes(),
                        " nodes, ", graph->work->kept_bytes() >> 20, " MiB of its own"));
  // Captured, not run: its first replay is this step. Should the launch fail (the device out
  // of memory for the graph's activations), nothing ran: the shape goes back to eager steps.
  try {
    graph->work->replay();
  } catch (const Error& e) {
    graph.reset();
    for (const auto& [path, a] : counters) opt_state_.set(path, a);
    shape.given_up = true;
    refuse("the step of batch " + signature, without_graphs_prefix(e.what()), false);
    return run_(micro_batches);
  }
  shape.graph = std::move(graph);
  ++replays_;
  StepResults out = copied(shape.graph->outputs);
  out.host_reads = host_read_count() - reads;
  out.host_uploads = host_upload_count() - uploads;
  return out;
}

StepResults CapturedSteps::replay(const std::vector<Batch>& micro_batches, Graph& graph) {
  const uint64_t reads = host_read_count(), uploads = host_upload_count();
  autodiff::NoGradGuard no_grad;
  for (size_t m = 0; m < micro_batches.size(); ++m)
    for (const auto& [name, a] : micro_batches[m]) copy_into(graph.inputs[m].at(name), a);
  optimizer_.host_step(opt_state_);
  std::optional<trace::Span> span;
  if (trace::enabled()) span.emplace("phase", "graph_replay");
  graph.work->replay();
  prim::count_model_flops(graph.model_flops);
  ++replays_;
  StepResults out = copied(graph.outputs);
  out.host_reads = host_read_count() - reads;
  out.host_uploads = host_upload_count() - uploads;
  return out;
}

}  // namespace mt::train
