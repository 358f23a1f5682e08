#include "meshtrain/backend/cuda/device_trace.h"

#include <cupti.h>
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "meshtrain/core/error.h"
#include "meshtrain/core/trace.h"

namespace mt::cuda {

namespace {

// CUPTI fills buffers it asks for and hands them back full (or at a flush) on its own thread.
constexpr size_t kBufferBytes = 8u << 20;
constexpr size_t kAlign = 8;

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMSET};

struct TraceState {
  std::mutex mutex;
  std::vector<DeviceSpan> spans;
  bool registered = false, on = false;
  // CUPTI's clock at the (re)start and the host trace's: a record's time maps across by the
  // offset; records of work that began before the restart are left out.
  uint64_t cupti_start_ns = 0;
  double trace_start_us = 0;
  uint64_t dropped = 0;
  uint64_t untimed = 0;  // records CUPTI could not time (start 0, or end before start)
};
TraceState& state() {
  static TraceState* s = new TraceState;  // leaked: CUPTI may call back during exit
  return *s;
}

std::string cupti_error(CUptiResult r) {
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  return text ? text : "unknown CUPTI error";
}

// "void mt::cuda::(anonymous namespace)::add_kernel<float>(float const*, ...)" -> up to the
// argument list; a template's arguments kept (they tell bf16 from f32 launches).
std::string kernel_name(const char* mangled) {
  if (!mangled) return "kernel";
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  int depth = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '<') ++depth;
    if (name[i] == '>') --depth;
    if (name[i] == '(' && depth == 0) {
      name.resize(i);
      break;
    }
  }
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  return name;
}

const char* copy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  // A span and CUPTI's own start and end (ns), mapped to the trace's time base under the lock
  // (a restart may move the base meanwhile).
  struct Timed {
    DeviceSpan span;
    uint64_t start, end;
  };
  std::vector<Timed> timed;
  uint64_t untimed = 0;
  CUpti_Activity* record = nullptr;
  // CUPTI writes 0s when it could not time a record.
  auto add = [&](DeviceSpan d, uint64_t start, uint64_t end) {
    if (start == 0 || end < start) ++untimed;
    else timed.push_back({std::move(d), start, end});
  };
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    DeviceSpan d;
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      d.name = kernel_name(k->name);
      d.kind = "kernel";
      d.graph = k->graphId;
      add(std::move(d), k->start, k->end);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      d.name = copy_name(m->copyKind);
      d.kind = "memcpy";
      d.bytes = double(m->bytes);
      d.graph = m->graphId;
      add(std::move(d), m->start, m->end);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      d.name = "memset";
      d.kind = "memset";
      d.bytes = double(m->bytes);
      d.graph = m->graphId;
      add(std::move(d), m->start, m->end);
    }
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(context, stream, &dropped);
  std::free(buffer);
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.dropped += dropped;
  s.untimed += untimed;
  for (Timed& t : timed) {
    if (t.start < s.cupti_start_ns) continue;  // begun before the (re)start
    // The difference first: epoch nanoseconds (~1.8e18) in a double would round to 256 ns.
    t.span.start_us = s.trace_start_us + double(t.start - s.cupti_start_ns) / 1000.0;
    t.span.dur_us = double(t.end - t.start) / 1000.0;
    s.spans.push_back(std::move(t.span));
  }
}

}  // namespace

std::string start_device_trace() {
  TraceState& s = state();
  bool on = false;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    on = s.on;
  }
  // CUPTI is called outside the lock: it may hand a buffer back (buffer_completed, which
  // takes the lock) from within these calls.
  if (!on) {
    if (!s.registered) {
      const CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
      if (r != CUPTI_SUCCESS) return "CUPTI refused its activity callbacks: " + cupti_error(r);
      s.registered = true;
    }
    for (CUpti_ActivityKind kind : kKinds) {
      const CUptiResult r = cuptiActivityEnable(kind);
      if (r != CUPTI_SUCCESS) {
        for (CUpti_ActivityKind k : kKinds) cuptiActivityDisable(k);
        return "CUPTI cannot time device work (" + cupti_error(r) +
               "; another profiler such as nsys or ncu may hold it)";
      }
    }
  }
  uint64_t now_ns = 0;
  cuptiGetTimestamp(&now_ns);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.spans.clear();
  s.dropped = s.untimed = 0;
  s.cupti_start_ns = now_ns;
  s.trace_start_us = trace::now_us();
  s.on = true;
  return "";
}

std::vector<DeviceSpan> stop_device_trace() {
  TraceState& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.on) return {};
  }
  cudaDeviceSynchronize();  // the records of work still queued come in with the flush
  cudaGetLastError();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.on = false;
  std::vector<DeviceSpan> out = std::move(s.spans);
  s.spans.clear();
  std::sort(out.begin(), out.end(), [](const DeviceSpan& a, const DeviceSpan& b) { return a.start_us < b.start_us; });
  if (s.dropped || s.untimed)
    out.push_back({detail::concat("(", s.dropped, " records dropped, ", s.untimed, " untimed)"), "kernel",
                   out.empty() ? 0 : out.back().start_us, 0, 0, 0});
  return out;
}

}  // namespace mt::cuda
