#include "meshtrain/core/trace.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>

namespace mt::trace {

namespace detail {
std::atomic<bool> g_on{false};
}

namespace {

using Clock = std::chrono::steady_clock;

// One buffer per thread that ever recorded; owned by the recorder for the process's life,
// so a thread's exit never loses or dangles what it recorded.
struct ThreadBuffer {
  std::mutex mu;  // taken by its own thread per event (uncontended) and by start/stop
  std::vector<Event> events;
  int tid = 0;
};

struct Recorder {
  std::mutex mu;  // guards buffers, threads, next_tid
  Clock::time_point t0 = Clock::now();
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;
  std::vector<std::pair<int, std::string>> threads;
  int next_tid = 1;
};
Recorder& recorder() {
  static Recorder r;
  return r;
}

thread_local ThreadBuffer* t_buffer = nullptr;
thread_local const char* t_phase = "";
thread_local int t_backward_depth = 0;

ThreadBuffer& this_buffer() {
  if (!t_buffer) {
    Recorder& r = recorder();
    std::lock_guard<std::mutex> lock(r.mu);
    r.buffers.push_back(std::make_unique<ThreadBuffer>());
    t_buffer = r.buffers.back().get();
    t_buffer->tid = r.next_tid++;
    r.threads.emplace_back(t_buffer->tid, "thread " + std::to_string(t_buffer->tid));
  }
  return *t_buffer;
}

// Phase names live as long as the process, so events may point at them.
const char* intern(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  return names.insert(name).first->c_str();
}

void append(Event&& e) {
  ThreadBuffer& b = this_buffer();
  e.tid = b.tid;
  std::lock_guard<std::mutex> lock(b.mu);
  b.events.push_back(std::move(e));
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += c;
  }
  return out;
}

}  // namespace

void start() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& b : r.buffers) {
    std::lock_guard<std::mutex> buffer_lock(b->mu);
    b->events.clear();
  }
  r.t0 = Clock::now();
  detail::g_on.store(true, std::memory_order_relaxed);
}

Recording stop() {
  Recorder& r = recorder();
  detail::g_on.store(false, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(r.mu);
  Recording out;
  out.threads = r.threads;
  for (auto& b : r.buffers) {
    std::lock_guard<std::mutex> buffer_lock(b->mu);
    for (Event& e : b->events) out.events.push_back(std::move(e));
    b->events.clear();
  }
  std::stable_sort(out.events.begin(), out.events.end(),
                   [](const Event& a, const Event& b) { return a.ts_us < b.ts_us; });
  return out;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now() - recorder().t0).count();
}

void name_this_thread(const std::string& name) {
  const int tid = this_buffer().tid;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& [id, n] : r.threads)
    if (id == tid) n = name;
}

void complete(std::string name, std::string category, double start_us, double dur_us, std::string args) {
  if (!enabled()) return;
  Event e;
  e.name = std::move(name);
  e.category = std::move(category);
  e.ts_us = start_us;
  e.dur_us = dur_us;
  e.args = std::move(args);
  append(std::move(e));
}

void complete_op(const char* name, const char* category, double start_us, double dur_us, OpDetails details) {
  if (!enabled()) return;
  Event e;
  e.name = name;
  e.category = category;
  e.ts_us = start_us;
  e.dur_us = dur_us;
  e.op = std::move(details);
  append(std::move(e));
}

void counter(std::string name, std::string args) {
  if (!enabled()) return;
  Event e;
  e.phase = 'C';
  e.name = std::move(name);
  e.category = "counter";
  e.ts_us = now_us();
  e.args = std::move(args);
  append(std::move(e));
}

std::string render_args(const Event& e) {
  if (e.category != "op" && e.category != "op_backward") return e.args;
  // Shapes as "f32(2, 3)"-like strings: inputs (dtype unknown here, dims only) and output.
  auto shape_at = [&](size_t& i) {
    const int64_t rank = e.op.shapes[i++];
    if (rank < 0) return std::string("-");
    std::string s = "(";
    for (int64_t d = 0; d < rank; ++d) s += (d ? ", " : "") + std::to_string(e.op.shapes[i++]);
    return s + (rank == 1 ? ",)" : ")");
  };
  std::vector<std::string> shapes;
  for (size_t i = 0; i < e.op.shapes.size();) shapes.push_back(shape_at(i));
  std::string inputs;
  for (size_t k = 0; k + 1 < shapes.size(); ++k) inputs += (k ? ", " : "") + shapes[k];
  std::string out = arg("inputs", inputs) + ", " + arg("output", std::string(e.op.dtype) + (shapes.empty() ? "" : shapes.back())) +
                    ", " + arg("flops", e.op.flops) + ", " + arg("bytes", e.op.bytes) + ", " +
                    arg("recorded", e.op.recorded ? 1.0 : 0.0) + ", " + arg("phase", e.op.phase) + ", " +
                    arg("kind", e.op.kind);
  if (!e.args.empty()) out += ", " + e.args;
  return out;
}

std::string arg(const std::string& key, double value) {
  // Shortest round-trip form (to_chars is several times faster than printf's %.17g, and
  // this runs for every recorded op). JSON has no NaN or infinity: they become null.
  char buf[64];
  if (!std::isfinite(value)) return "\"" + escape(key) + "\": null";
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return "\"" + escape(key) + "\": " + std::string(buf, ec == std::errc() ? end : buf);
}

std::string arg(const std::string& key, const std::string& value) {
  return "\"" + escape(key) + "\": \"" + escape(value) + "\"";
}

Span::Span(std::string category, std::string name, std::string args) {
  if (!enabled()) return;
  active_ = true;
  category_ = std::move(category);
  name_ = std::move(name);
  args_ = std::move(args);
  if (category_ == "phase") {
    saved_phase_ = t_phase;
    t_phase = intern(name_);  // op events keep the pointer past this span's end
  }
  if (category_ == "vjp") ++t_backward_depth;
  start_us_ = now_us();
}

Span::~Span() {
  if (!active_) return;
  const double end = now_us();
  if (saved_phase_) t_phase = saved_phase_;
  if (category_ == "vjp") --t_backward_depth;
  complete(std::move(name_), std::move(category_), start_us_, end - start_us_, std::move(args_));
}

void Span::add_args(const std::string& more) {
  if (!active_ || more.empty()) return;
  args_ += (args_.empty() ? "" : ", ") + more;
}

const char* current_phase() { return t_phase; }
bool in_backward() { return t_backward_depth > 0; }

}  // namespace mt::trace
