#pragma once
// The trace recorder behind --profile: timed spans and counters from every layer (op kernels
// and their VJPs, collectives on the communication thread, data loading, the Trainer's
// phases), kept in memory while recording and written as a Chrome trace by train/profiler.
// When not recording, every entry point costs one relaxed atomic load; when recording, each
// thread appends to its own buffer (an uncontended lock), so threads never wait on each other.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace mt::trace {

// What an op kernel's span carries, kept raw while recording and rendered when the trace is
// written (formatting it per call would cost more than small kernels take).
struct OpDetails {
  std::vector<int64_t> shapes;  // per input then the output: rank, dims... (rank -1: undefined)
  const char* dtype = "";       // the output's
  double flops = 0, bytes = 0;
  bool recorded = false;        // a VJP was recorded
  const char* phase = "";       // current_phase() at the call
  const char* kind = "";        // prim::OpKind's name: "gemm", "attention" or "other"
};

struct Event {
  char phase = 'X';  // 'X': a complete span, 'C': a counter sample
  std::string name;
  std::string category;  // "op", "vjp", "collective", "comm_wait", "data", "step", ...
  double ts_us = 0;      // since recording started
  double dur_us = 0;
  int tid = 0;           // this process's thread track
  std::string args;      // a JSON object's members, already rendered ("\"k\": 1, ...") or empty
  OpDetails op{};        // op spans only
};
// The members of an event's args object: `args` plus its op details, rendered.
std::string render_args(const Event& e);

struct Recording {
  std::vector<Event> events;
  std::vector<std::pair<int, std::string>> threads;  // (tid, name)
};

namespace detail {
extern std::atomic<bool> g_on;
}
inline bool enabled() { return detail::g_on.load(std::memory_order_relaxed); }

// Starts recording (dropping anything recorded before); the time base is now.
void start();
// Stops recording and hands over what was recorded.
Recording stop();
// Microseconds since start().
double now_us();

// Names the calling thread's track ("compute", "communication", "data loader"). Threads that
// never name themselves appear as "thread N".
void name_this_thread(const std::string& name);

void complete(std::string name, std::string category, double start_us, double dur_us, std::string args = {});
void complete_op(const char* name, const char* category, double start_us, double dur_us, OpDetails details);
void counter(std::string name, std::string args);

// "\"key\": value" pieces for Event::args.
std::string arg(const std::string& key, double value);
std::string arg(const std::string& key, const std::string& value);  // JSON-escaped

// A span from construction to destruction (nothing when not recording at construction).
// Spans of category "phase" also set current_phase() for the spans opened inside them.
class Span {
 public:
  Span(std::string category, std::string name, std::string args = {});
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  void add_args(const std::string& more);

 private:
  bool active_ = false;
  double start_us_ = 0;
  std::string category_, name_, args_;
  const char* saved_phase_ = nullptr;
};

// The name of the innermost enclosing "phase" span on this thread (e.g. "optimizer"), or "".
const char* current_phase();
// Inside a "vjp" span on this thread: ops running now belong to the backward pass.
bool in_backward();

}  // namespace mt::trace
