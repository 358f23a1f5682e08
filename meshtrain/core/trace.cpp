#include "meshtrain/core/trace.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>

namespace mt::trace {

namespace detail {
std::atomic<bool> g_on{false};
}

namespace {

using Clock = std::chrono::steady_clock;

struct Recorder {
  std::mutex mu;
  Clock::time_point t0 = Clock::now();
  std::vector<Event> events;
  std::vector<std::pair<int, std::string>> threads;
  int next_tid = 1;
};
Recorder& recorder() {
  static Recorder r;
  return r;
}

thread_local int t_tid = 0;
thread_local const char* t_phase = "";
thread_local int t_backward_depth = 0;

int this_tid(Recorder& r) {  // r.mu held
  if (t_tid == 0) {
    t_tid = r.next_tid++;
    r.threads.emplace_back(t_tid, "thread " + std::to_string(t_tid));
  }
  return t_tid;
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
  r.events.clear();
  r.t0 = Clock::now();
  detail::g_on.store(true, std::memory_order_relaxed);
}

Recording stop() {
  Recorder& r = recorder();
  detail::g_on.store(false, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(r.mu);
  Recording out{std::move(r.events), r.threads};
  r.events.clear();
  return out;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now() - recorder().t0).count();
}

void name_this_thread(const std::string& name) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  const int tid = this_tid(r);
  for (auto& [id, n] : r.threads)
    if (id == tid) n = name;
}

void complete(std::string name, std::string category, double start_us, double dur_us, std::string args) {
  if (!enabled()) return;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.push_back({'X', std::move(name), std::move(category), start_us, dur_us, this_tid(r), std::move(args)});
}

void counter(std::string name, std::string args) {
  if (!enabled()) return;
  const double ts = now_us();
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.push_back({'C', std::move(name), "counter", ts, 0, this_tid(r), std::move(args)});
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
    phase_storage_ = name_;
    t_phase = phase_storage_.c_str();
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
