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
  // CUPTI's clock at the start and the host trace's: a record's time maps across by the offset.
  uint64_t cupti_start_ns = 0;
  double trace_start_us = 0;
  uint64_t dropped = 0;
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
  TraceState& s = state();
  std::vector<DeviceSpan> spans;
  CUpti_Activity* record = nullptr;
  auto span_of = [&](uint64_t start, uint64_t end) {
    DeviceSpan d;
    d.start_us = s.trace_start_us + (double(start) - double(s.cupti_start_ns)) / 1000.0;
    d.dur_us = end > start ? double(end - start) / 1000.0 : 0.0;
    return d;
  };
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      DeviceSpan d = span_of(k->start, k->end);
      d.name = kernel_name(k->name);
      d.kind = "kernel";
      d.graph = k->graphId;
      spans.push_back(std::move(d));
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      DeviceSpan d = span_of(m->start, m->end);
      d.name = copy_name(m->copyKind);
      d.kind = "memcpy";
      d.bytes = double(m->bytes);
      d.graph = m->graphId;
      spans.push_back(std::move(d));
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      DeviceSpan d = span_of(m->start, m->end);
      d.name = "memset";
      d.kind = "memset";
      d.bytes = double(m->bytes);
      d.graph = m->graphId;
      spans.push_back(std::move(d));
    }
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(context, stream, &dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.dropped += dropped;
  s.spans.insert(s.spans.end(), std::make_move_iterator(spans.begin()), std::make_move_iterator(spans.end()));
}

}  // namespace

std::string start_device_trace() {
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.on) return "";
  if (!s.registered) {
    const CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) return "CUPTI refused its activity callbacks: " + cupti_error(r);
    s.registered = true;
  }
  s.spans.clear();
  s.dropped = 0;
  for (CUpti_ActivityKind kind : kKinds) {
    const CUptiResult r = cuptiActivityEnable(kind);
    if (r != CUPTI_SUCCESS) {
      for (CUpti_ActivityKind k : kKinds) cuptiActivityDisable(k);
      return "CUPTI cannot time device work (" + cupti_error(r) +
             "; another profiler such as nsys or ncu may hold it)";
    }
  }
  cuptiGetTimestamp(&s.cupti_start_ns);
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
  if (s.dropped)
    out.push_back({detail::concat("(", s.dropped, " records dropped)"), "kernel", out.empty() ? 0 : out.back().start_us, 0, 0, 0});
  return out;
}

}  // namespace mt::cuda
