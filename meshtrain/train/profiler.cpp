#include "meshtrain/train/profiler.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "meshtrain/core/allocator.h"
#include "meshtrain/core/device.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/io/json.h"
#include "meshtrain/io/mapped_file.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/train/device_profile.h"
#include "meshtrain/train/host_name.h"
#include "meshtrain/train/memory_usage.h"

namespace mt::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

ProfileRange ProfileRange::parse(const std::string& text) {
  static const std::regex form(R"(\s*(\d+)\s*(?::\s*(\d+)\s*)?)");
  std::smatch m;
  MT_CHECK(std::regex_match(text, m, form), "[profile] expected --profile START:END (optimizer steps from 1, e.g. 10:12), got '",
           text, "'");
  ProfileRange r;
  r.first = std::stoll(m[1].str());
  r.last = m[2].matched ? std::stoll(m[2].str()) : r.first;
  MT_CHECK(r.first >= 1, "[profile] steps are numbered from 1, got '", text, "'");
  MT_CHECK(r.last >= r.first, "[profile] the range '", text, "' ends before it starts");
  return r;
}

// Each kernel call as a span on the calling thread, ending now. The details stay raw here
// (rank and dims per array) and are rendered when the trace is written.
void record_op_span(const prim::OpEvent& e) {
  if (!trace::enabled()) return;
  const double end = trace::now_us(), dur = e.seconds * 1e6;
  const prim::Cost c = e.primitive.cost(e.inputs, e.info);
  trace::OpDetails d;
  size_t n = 0;
  for (const Array& a : e.inputs) n += 1 + (a.defined() ? size_t(a.ndim()) : 0);
  d.shapes.reserve(n + 1 + size_t(e.info.shape.ndim()));
  auto push = [&](bool defined, const Shape& s) {
    d.shapes.push_back(defined ? s.ndim() : -1);
    if (defined)
      for (int64_t x : s) d.shapes.push_back(x);
  };
  for (const Array& a : e.inputs) push(a.defined(), a.defined() ? a.shape() : Shape{});
  push(true, e.info.shape);
  d.dtype = dtype_name(e.info.dtype);
  d.flops = c.flops;
  d.bytes = c.bytes;
  d.recorded = e.recorded;
  d.phase = trace::current_phase();
  d.kind = prim::op_kind_name(e.primitive.kind());
  trace::complete_op(e.primitive.name(), trace::in_backward() ? "op_backward" : "op", end - dur, dur, std::move(d));
}

namespace {

json args_of(const trace::Event& e) {
  const std::string members = trace::render_args(e);
  if (members.empty()) return json::object();
  return json::parse("{" + members + "}");
}

json to_json(const trace::Event& e, int pid) {
  json j = {{"name", e.name}, {"cat", e.category}, {"ph", std::string(1, e.phase)}, {"ts", e.ts_us}, {"pid", pid},
            {"tid", e.tid}, {"args", args_of(e)}};
  if (e.phase == 'X') j["dur"] = e.dur_us;
  return j;
}

// What each primitive's time counts as, from its op spans (prim::Primitive::kind); a VJP
// span takes its primitive's. Spans of anything else (views, redistributions) are "other".
std::map<std::string, std::string> kinds_by_op(const trace::Recording& recording) {
  std::map<std::string, std::string> kinds;
  for (const trace::Event& e : recording.events)
    if (e.phase == 'X' && (e.category == "op" || e.category == "op_backward") && *e.op.kind) kinds[e.name] = e.op.kind;
  return kinds;
}

}  // namespace

OpProfile summarize(const trace::Recording& recording) {
  OpProfile p;
  std::map<std::tuple<std::string, std::string, std::string>, OpRow> rows;
  double gemm = 0, attention = 0, other_ops = 0, optimizer = 0, comm_wait = 0, data_wait = 0;
  const std::map<std::string, std::string> kinds = kinds_by_op(recording);
  auto kind_of = [&](const std::string& op) {
    auto it = kinds.find(op);
    return it == kinds.end() ? std::string("other") : it->second;
  };
  for (const trace::Event& e : recording.events) {
    if (e.phase != 'X') continue;
    const double ms = e.dur_us / 1000;
    if (e.category == "step") {
      ++p.steps;
      p.step_ms += ms;
    } else if (e.category == "op" || e.category == "op_backward" || e.category == "collective") {
      const std::string phase = e.category == "op" ? "forward" : e.category == "op_backward" ? "backward" : "collective";
      const std::string dtype = phase == "collective" ? "" : e.op.dtype;
      OpRow& r = rows[{phase, e.name, dtype}];
      r.name = e.name;
      r.phase = phase;
      r.dtype = dtype;
      ++r.calls;
      r.total_ms += ms;
      if (phase == "collective") {
        r.bytes += args_of(e).value("bytes", 0.0);
        continue;
      }
      r.kind = e.op.kind;
      r.flops += e.op.flops;
      if (std::string(e.op.phase) == "optimizer") continue;  // counted in the optimizer's span
      const std::string kind = e.op.kind;
      (kind == "gemm" ? gemm : kind == "attention" ? attention : other_ops) += ms;
    } else if (e.category == "phase" && e.name == "optimizer") {
      optimizer += ms;
    } else if (e.category == "comm_wait") {
      comm_wait += ms;
    } else if (e.category == "data" && e.name == "data_wait") {
      data_wait += ms;
    }
  }
  // A VJP's own time (fused backward kernels it calls directly, bookkeeping) is its span
  // minus the op spans inside it: a "(vjp self)" row, so the table accounts for every VJP.
  std::map<int, std::vector<const trace::Event*>> by_thread;
  for (const trace::Event& e : recording.events)
    if (e.phase == 'X' && (e.category == "vjp" || e.category == "op_backward" || e.category == "op"))
      by_thread[e.tid].push_back(&e);
  for (auto& [tid, list] : by_thread) {
    std::sort(list.begin(), list.end(), [](const trace::Event* a, const trace::Event* b) {
      return a->ts_us < b->ts_us || (a->ts_us == b->ts_us && a->dur_us > b->dur_us);
    });
    struct Open {
      const trace::Event* vjp;
      double children_us;
    };
    std::vector<Open> open;
    auto close = [&](const Open& o) {
      const double self_ms = std::max(0.0, o.vjp->dur_us - o.children_us) / 1000;
      OpRow& r = rows[{"backward", o.vjp->name + " (vjp self)", ""}];
      r.name = o.vjp->name + " (vjp self)";
      r.phase = "backward";
      ++r.calls;
      r.total_ms += self_ms;
      (kind_of(o.vjp->name) == "attention" ? attention : other_ops) += self_ms;
    };
    for (const trace::Event* e : list) {
      while (!open.empty() && e->ts_us >= open.back().vjp->ts_us + open.back().vjp->dur_us) {
        close(open.back());
        open.pop_back();
      }
      if (e->category == "vjp") {
        if (!open.empty()) open.back().children_us += e->dur_us;
        open.push_back({e, 0});
      } else if (!open.empty()) {
        open.back().children_us += e->dur_us;
      }
    }
    while (!open.empty()) {
      close(open.back());
      open.pop_back();
    }
  }
  for (auto& [key, row] : rows) {
    // Achieved FLOP rates for the GEMMs (attention's included); other ops' "flops" are nominal.
    if (row.phase != "collective" && row.kind != "gemm") row.flops = 0;
    p.rows.push_back(row);
  }
  std::sort(p.rows.begin(), p.rows.end(), [](const OpRow& a, const OpRow& b) { return a.total_ms > b.total_ms; });
  auto pct = [&](double ms) { return p.step_ms > 0 ? 100.0 * ms / p.step_ms : 0.0; };
  const double known = gemm + attention + other_ops + optimizer + comm_wait + data_wait;
  p.breakdown = {{"gemm", pct(gemm)},
                 {"attention", pct(attention)},
                 {"elementwise_norm", pct(other_ops)},
                 {"optimizer", pct(optimizer)},
                 {"communication_exposed", pct(comm_wait)},
                 {"data_wait", pct(data_wait)},
                 {"other", std::max(0.0, pct(p.step_ms - known))}};
  return p;
}

std::string format_op_table(const OpProfile& p) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "op profile: %lld step(s), %.1f ms\nstep breakdown:", (long long)p.steps, p.step_ms);
  out << line;
  for (size_t i = 0; i < p.breakdown.size(); ++i) {
    std::string name = p.breakdown[i].first;
    std::replace(name.begin(), name.end(), '_', ' ');
    if (name == "elementwise norm") name = "elementwise/norm";
    std::snprintf(line, sizeof line, "%s %s %.1f%%", i ? " |" : "", name.c_str(), p.breakdown[i].second);
    out << line;
  }
  std::snprintf(line, sizeof line, "\n%-10s %-24s %-5s %7s %10s %7s %10s %10s\n", "phase", "op", "dtype", "calls",
                "total ms", "% step", "mean us", "GFLOP/s");
  out << line;
  for (const OpRow& r : p.rows) {
    const double pct = p.step_ms > 0 ? 100.0 * r.total_ms / p.step_ms : 0.0;
    const double mean_us = r.calls ? 1000.0 * r.total_ms / double(r.calls) : 0.0;
    std::string rate = "";
    if (r.phase == "collective" && r.bytes > 0 && r.total_ms > 0) {
      std::snprintf(line, sizeof line, "%.2f GB/s", r.bytes / (r.total_ms * 1e6));
      rate = line;
    } else if (r.flops > 0 && r.total_ms > 0) {
      std::snprintf(line, sizeof line, "%.1f", r.flops / (r.total_ms * 1e6));
      rate = line;
    }
    std::snprintf(line, sizeof line, "%-10s %-24s %-5s %7lld %10.3f %7.2f %10.1f %10s\n", r.phase.c_str(),
                  r.name.c_str(), r.dtype.c_str(), (long long)r.calls, r.total_ms, pct, mean_us, rate.c_str());
    out << line;
  }
  return out.str();
}

Profiler::Profiler(ProfileRange range, int64_t done_steps, int64_t total_steps, std::string dir,
                   std::function<void(const std::string&)> print)
    : range_(range), dir_(std::move(dir)), print_(std::move(print)) {
  MT_CHECK(range.first > done_steps && range.last <= total_steps, "[profile] steps ", range.first, ":", range.last,
           " are outside this run, which takes steps ", done_steps + 1, " to ", total_steps);
  // The device's timings are switched on now, before any step is captured as a CUDA graph, and
  // restarted at the range's first step: CUPTI may not time the nodes of a graph instantiated
  // while it was off. (Records of the steps before the range are dropped as they come in.)
  if (default_device().is_cuda()) device_trace_ = cuda_runtime().start_device_trace().empty();
}

Profiler::~Profiler() {
  if (recording_) {
    prim::set_op_observer({});
    trace::stop();
  }
  if (device_trace_) cuda_runtime().stop_device_trace();
}

void Profiler::start() {
  // A barrier first: every rank's time base starts together (within the barrier's skew).
  dist::world().barrier();
  trace::start();
  trace::name_this_thread("compute");
  prim::set_op_observer(record_op_span);
  recording_ = true;
  // Host spans of a GPU step time its launches; the device's own timings say what ran when.
  if (default_device().is_cuda()) {
    const std::string why_not = cuda_runtime().start_device_trace();
    device_trace_ = why_not.empty();
    if (!device_trace_ && print_) print_("[profile] no device track: " + why_not);
  }
}

void Profiler::step_begin(int64_t step) {
  if (step == range_.first) start();
  if (recording_) step_span_.emplace("step", "step " + std::to_string(step));
}

void Profiler::step_end(int64_t step) {
  if (!recording_) return;
  {
    trace::Span span("phase", "profiler");  // its own bookkeeping, so that the step stays covered
    trace::counter("memory", trace::arg("live_bytes", double(CachingAllocator::instance().stats().bytes_in_use)) + ", " +
                                 trace::arg("rss_bytes", resident_bytes()));
  }
  step_span_.reset();
  if (step >= range_.last) finish();
}

void Profiler::finish() {
  if (!recording_) return;
  step_span_.reset();
  prim::set_op_observer({});
  recording_ = false;
  std::vector<DeviceSpan> device_spans;
  if (device_trace_) device_spans = cuda_runtime().stop_device_trace();  // waits for the device
  trace::Recording rec = trace::stop();
  if (device_trace_) add_device_spans(rec, device_spans);
  device_trace_ = false;
  dist::Communicator& world = dist::world();
  const int rank = world.rank();
  fs::create_directories(dir_);
  json part = {{"rank", rank}, {"host", host_name()}, {"threads", rec.threads}, {"events", json::array()}};
  for (const trace::Event& e : rec.events) part["events"].push_back(to_json(e, rank));
  const fs::path part_path = fs::path(dir_) / ("trace.rank" + std::to_string(rank) + ".json");
  io::write_file_atomic(part_path.string(), part.dump());
  world.barrier();
  if (rank == 0) {
    json events = json::array();
    for (int r = 0; r < world.size(); ++r) {
      const fs::path p = fs::path(dir_) / ("trace.rank" + std::to_string(r) + ".json");
      json other = io::read_json_file(p.string());
      events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r},
                        {"args", {{"name", "rank " + std::to_string(r) + " (" + other.value("host", "") + ")"}}}});
      for (const auto& t : other["threads"])
        events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", t[0]}, {"args", {{"name", t[1]}}}});
      for (auto& e : other["events"]) events.push_back(std::move(e));
      fs::remove(p);
    }
    io::write_file_atomic((fs::path(dir_) / "trace.json").string(),
                          json({{"traceEvents", events}, {"displayTimeUnit", "ms"}}).dump());
    const OpProfile profile = summarize(rec);
    json ops = {{"steps", profile.steps}, {"step_ms", profile.step_ms}, {"rank", 0}, {"rows", json::array()}};
    for (const OpRow& r : profile.rows)
      ops["rows"].push_back({{"name", r.name}, {"phase", r.phase}, {"dtype", r.dtype}, {"calls", r.calls}, {"total_ms", r.total_ms},
                             {"flops", r.flops}, {"bytes", r.bytes}});
    for (const auto& [k, v] : profile.breakdown) ops["breakdown"][k] = v;
    const DeviceProfile device = summarize_device(rec);
    if (device.recorded) {
      json rows = json::array();
      for (const DeviceRow& r : device.rows)
        rows.push_back({{"name", r.name}, {"kind", r.kind}, {"calls", r.calls}, {"total_ms", r.total_ms}});
      ops["device"] = {{"busy_ms", device.busy_ms}, {"kernels", device.kernels}, {"copies", device.copies},
                       {"fills", device.fills}, {"from_graphs", device.from_graphs}, {"rows", std::move(rows)}};
    }
    const std::string table = format_op_table(profile) + format_device_table(device, profile.step_ms);
    io::write_file_atomic((fs::path(dir_) / "ops.json").string(), ops.dump(2) + "\n");
    io::write_file_atomic((fs::path(dir_) / "ops.txt").string(), table);
    if (print_) print_(table + "trace: " + (fs::path(dir_) / "trace.json").string() + " (open it in ui.perfetto.dev)");
  }
  world.barrier();
}

}  // namespace mt::train
