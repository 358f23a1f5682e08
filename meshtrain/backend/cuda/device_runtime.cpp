// The GPU runtime behind core/device.h: one compute stream on the process's GPU, memory from
// a stream-ordered pool (cudaMallocAsync) that keeps freed blocks cached (release threshold
// = everything), so after warm-up no step reaches cudaMalloc; copies and fills on the stream.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/device_trace.h"
#include "meshtrain/backend/cuda/pinned_staging.h"
#include "meshtrain/backend/cuda/step_graph.h"
#include "meshtrain/backend/cuda/step_graph_hooks.h"
#include "meshtrain/core/device.h"

namespace mt::cuda {

namespace {

// A StepGraph being recorded (step_graph.h): the thread recording it, the graph allocations
// still alive, and the older allocations released meanwhile (the graph keeps them).
struct Capture {
  std::thread::id owner;
  std::unordered_map<void*, size_t> graph_allocations;
  std::vector<std::pair<void*, size_t>> released;
};

struct Context {
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  std::atomic<size_t> in_use{0}, peak{0};
  std::atomic<uint64_t> allocations{0};
  // Capture state, under capture_mutex. graph_owned: memory a StepGraph frees (its outputs,
  // and a failed capture's allocations, which never existed): their handles free nothing.
  std::mutex capture_mutex;
  std::condition_variable capture_done;
  Capture* capture = nullptr;
  std::unordered_set<void*> graph_owned;
};

std::mutex g_mutex;
// Leaked on purpose: arrays held by static objects are freed after main returns. Set once;
// every kernel launch reads it, so the read is lock-free.
std::atomic<Context*> g_context{nullptr};

std::string mib(size_t bytes) { return detail::concat(double(bytes) / double(1 << 20), " MiB"); }

Context& existing(Context* c, int index) {
  MT_CHECK(c->device == index, "[cuda] this process already uses cuda:", c->device,
           "; one process drives one GPU (run one process per GPU)");
  return *c;
}

Context& context_for(int index) {
  if (Context* c = g_context.load(std::memory_order_acquire)) return existing(c, index);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (Context* c = g_context.load(std::memory_order_acquire)) return existing(c, index);
  auto* c = new Context();
  c->device = index;
  check(cudaSetDevice(index), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaDeviceGetDefaultMemPool(&c->pool, index), "cudaDeviceGetDefaultMemPool");
  uint64_t keep_everything = UINT64_MAX;
  check(cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep_everything), "cudaMemPoolSetAttribute");
  g_context.store(c, std::memory_order_release);
  return *c;
}

// A thread's current CUDA device is its own: every thread that touches the GPU (the training
// thread, data-loader threads) makes the process's device current once.
Context& bound_context(int index) {
  Context& c = context_for(index);
  thread_local int t_device = -1;
  if (t_device != c.device) {
    check(cudaSetDevice(c.device), "cudaSetDevice");
    t_device = c.device;
  }
  return c;
}

// The process's context, bound to the calling thread.
Context& context() {
  Context* c = g_context.load(std::memory_order_acquire);
  return bound_context(c ? c->device : 0);
}

// Runtime calls other than the capturing thread's wait while a capture records: work they put
// on the stream would join the graph. The capturing thread's own reads, uploads and waits
// cannot be replayed: they throw (step_graph.h).
bool await_capture(Context& c, const char* what, size_t bytes) {
  std::unique_lock<std::mutex> lock(c.capture_mutex);
  if (!c.capture) return false;
  if (c.capture->owner == std::this_thread::get_id())
    throw Error(detail::concat("[cuda graphs] ", what, bytes ? detail::concat(" of ", bytes, " bytes") : std::string(),
                               " inside a captured step: a graph replays its work as recorded, so the step must "
                               "neither read to the host nor upload nor wait; it runs eagerly instead"));
  c.capture_done.wait(lock, [&] { return c.capture == nullptr; });
  return false;
}

// Device-side work other threads put on the stream waits for a capture's end; the capturing
// thread's is recorded.
void wait_unless_capturing(Context& c) {
  std::unique_lock<std::mutex> lock(c.capture_mutex);
  if (c.capture && c.capture->owner != std::this_thread::get_id())
    c.capture_done.wait(lock, [&] { return c.capture == nullptr; });
}

// Leaked like the context: copies may be queued until exit.
PinnedStaging& staging() {
  static PinnedStaging* ring = new PinnedStaging(PinnedStaging::configured_capacity());
  return *ring;
}

class CudaRuntime final : public DeviceRuntime {
 public:
  int device_count() const override {
    static const int n = [] {
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // no driver or no GPU: not an error, just none
        return 0;
      }
      return count;
    }();
    return n;
  }
  std::string describe(int index) const override {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
      cudaGetLastError();  // not left for the next launch check to report
      return "unknown GPU";
    }
    return detail::concat(p.name, " (sm_", p.major, p.minor, ", ", double(p.totalGlobalMem) / double(1ull << 30),
                          " GiB)");
  }
  std::shared_ptr<void> allocate(int index, size_t bytes) const override {
    Context& c = bound_context(index);
    bool capturing = false;
    {
      std::unique_lock<std::mutex> lock(c.capture_mutex);
      if (c.capture && c.capture->owner != std::this_thread::get_id())
        c.capture_done.wait(lock, [&] { return c.capture == nullptr; });
      capturing = c.capture != nullptr;
    }
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes == 0 ? 1 : bytes, c.pool, c.stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
      throw Error(detail::concat("out of GPU memory (", cudaGetErrorString(e), ") asking for ", mib(bytes), ": ",
                                 mib(c.in_use.load()), " in use by arrays, ", mib(reserved(c)), " reserved by the pool, ",
                                 mib(free_b), " free of ", mib(total_b),
                                 "; lower the batch size or the sequence length, or recompute activations (--remat block)"));
    }
    const size_t now = c.in_use.fetch_add(bytes) + bytes;
    size_t peak = c.peak.load();
    while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
    }
    c.allocations.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(c.capture_mutex);
      c.graph_owned.erase(p);  // a dead capture's address, reused by a real allocation
      if (capturing) c.capture->graph_allocations[p] = bytes;
    }
    Context* cp = &c;
    return std::shared_ptr<void>(p, [cp, bytes](void* q) {
      cp->in_use.fetch_sub(bytes);
      {
        std::unique_lock<std::mutex> lock(cp->capture_mutex);
        if (cp->graph_owned.count(q)) return;  // a StepGraph's output: the graph frees it
        if (Capture* k = cp->capture) {
          auto it = k->graph_allocations.find(q);
          if (it == k->graph_allocations.end()) {
            // Older memory the graph may read on every replay: kept until the graph goes.
            k->released.emplace_back(q, bytes);
            return;
          }
          // Dropped during the capture: a free node of the graph (only the recording thread
          // may add one; another thread's drop leaves it to the graph as an output).
          if (k->owner != std::this_thread::get_id()) return;
          k->graph_allocations.erase(it);
        }
      }
      // Ordered after every kernel already enqueued that reads it. A failure (the runtime
      // shutting down at exit) is cleared, not left for the next launch check.
      if (cudaFreeAsync(q, cp->stream) != cudaSuccess) cudaGetLastError();
    });
  }
  void copy_to_host(void* host, const void* device, size_t bytes) const override {
    Context& c = context();
    await_capture(c, "a read to the host", bytes);
    check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, c.stream), "copy to host");
    check(cudaStreamSynchronize(c.stream), "copy to host (a kernel before it failed)");
  }
  void copy_from_host(void* device, const void* host, size_t bytes) const override {
    // Through the pinned ring (batches, small arrays): returns at once. Larger copies go from
    // pageable memory; the call returns once `host` has been read (staged by the driver).
    Context& c = context();
    await_capture(c, "an upload", bytes);
    if (staging().copy(device, host, bytes, c.stream)) return;
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, c.stream), "copy to device");
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) const override {
    Context& c = context();
    wait_unless_capturing(c);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c.stream), "device copy");
  }
  void fill_bytes(void* device, const void* pattern, size_t pattern_bytes, size_t count) const override {
    wait_unless_capturing(context());
    fill_pattern(device, pattern, pattern_bytes, count);
  }
  void synchronize() const override {
    if (Context* c = g_context.load(std::memory_order_acquire)) {
      await_capture(*c, "a wait for the stream", 0);
      check(cudaStreamSynchronize(c->stream), "synchronize");
    }
  }
  DeviceMemoryStats memory_stats(int index) const override {
    Context& c = context_for(index);
    return {c.in_use.load(), c.peak.load(), reserved(c), c.allocations.load()};
  }
  void reset_peak(int index) const override {
    Context& c = context_for(index);
    c.peak.store(c.in_use.load());
  }
  std::unique_ptr<CapturedWork> capture(const std::function<void()>& record) const override {
    return StepGraph::capture(record);
  }
  bool capturing() const override { return capture_hooks::capturing_on_this_thread(); }
  std::string start_device_trace() const override {
    if (device_count() == 0) return "no GPU is visible";
    return cuda::start_device_trace();
  }
  std::vector<DeviceSpan> stop_device_trace() const override { return cuda::stop_device_trace(); }

 private:
  static size_t reserved(Context& c) {
    uint64_t r = 0;
    if (cudaMemPoolGetAttribute(c.pool, cudaMemPoolAttrReservedMemCurrent, &r) != cudaSuccess) cudaGetLastError();
    return size_t(r);
  }
};

}  // namespace

cudaStream_t stream() { return context().stream; }

namespace capture_hooks {

void begin() {
  Context& c = context();
  {
    std::lock_guard<std::mutex> lock(c.capture_mutex);
    MT_CHECK(c.capture == nullptr, "[cuda graphs] a capture is already recording");
    c.capture = new Capture{std::this_thread::get_id(), {}, {}};
  }
  // Thread-local mode: this thread may not call what a capture cannot hold (cudaMalloc, a
  // synchronization); other threads are held off by the runtime itself.
  const cudaError_t e = cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::lock_guard<std::mutex> lock(c.capture_mutex);
    delete c.capture;
    c.capture = nullptr;
    c.capture_done.notify_all();
    throw_cuda_error(e, "cudaStreamBeginCapture");
  }
}

Ended end(bool keep) {
  Context& c = context();
  Ended out;
  const cudaError_t e = cudaStreamEndCapture(c.stream, &out.graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    out.graph = nullptr;
  }
  std::unique_ptr<Capture> k;
  {
    std::lock_guard<std::mutex> lock(c.capture_mutex);
    k.reset(c.capture);
    c.capture = nullptr;
    // The allocations still held: the graph's outputs (or, for a capture given up, addresses
    // that never held memory): their handles free nothing.
    for (const auto& [p, bytes] : k->graph_allocations) {
      c.graph_owned.insert(p);
      out.outputs.push_back(p);
      out.bytes += bytes;
    }
    c.capture_done.notify_all();
  }
  const bool kept = keep && out.graph != nullptr;
  for (const auto& [p, bytes] : k->released) {
    if (kept) {
      out.inputs.push_back(p);
      out.bytes += bytes;
    } else if (cudaFreeAsync(p, c.stream) != cudaSuccess) {  // nothing recorded will run
      cudaGetLastError();
    }
  }
  if (e != cudaSuccess) out.error = detail::concat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  return out;
}

void release(const std::vector<void*>& outputs, const std::vector<void*>& inputs, bool launched) {
  Context& c = context();
  // Outputs exist only once the graph ran: then they are freed, ordered after the last
  // replay. A graph never launched (its instantiation failed) leaves them marked graph-owned,
  // so handles still held free nothing; a real allocation at the address unmarks it.
  if (launched) {
    {
      std::lock_guard<std::mutex> lock(c.capture_mutex);
      for (void* p : outputs) c.graph_owned.erase(p);
    }
    for (void* p : outputs)
      if (cudaFreeAsync(p, c.stream) != cudaSuccess) cudaGetLastError();
  }
  for (void* p : inputs)
    if (cudaFreeAsync(p, c.stream) != cudaSuccess) cudaGetLastError();
}

bool capturing_on_this_thread() {
  Context* c = g_context.load(std::memory_order_acquire);
  if (!c) return false;
  std::lock_guard<std::mutex> lock(c->capture_mutex);
  return c->capture && c->capture->owner == std::this_thread::get_id();
}

}  // namespace capture_hooks
int active_device() { return context().device; }

void throw_cuda_error(cudaError_t e, const char* what) {
  cudaGetLastError();
  throw Error(detail::concat("[cuda] ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

}  // namespace mt::cuda

namespace mt {
const DeviceRuntime& cuda_runtime() {
  static const cuda::CudaRuntime runtime;
  return runtime;
}
}  // namespace mt
