// The GPU runtime behind core/device.h: one compute stream on the process's GPU, memory from
// a stream-ordered pool (cudaMallocAsync) that keeps freed blocks cached (release threshold
// = everything), so after warm-up no step reaches cudaMalloc; copies and fills on the stream.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/device_trace.h"
#include "meshtrain/backend/cuda/pinned_staging.h"
#include "meshtrain/backend/cuda/step_graph.h"
#include "meshtrain/backend/cuda/step_graph_hooks.h"
#include "meshtrain/core/device.h"

namespace mt::cuda {

namespace {

// Who frees one allocation, shared by its handle's deleter and the capture bookkeeping (under
// capture_mutex): once a StepGraph owns it (one of its outputs, or an allocation of a capture
// given up, which never held memory), its handle frees nothing, however long the handle
// outlives the graph and whatever later allocation takes the address.
struct AllocationState {
  bool graph_owned = false;
};

// A StepGraph being recorded (step_graph.h): the thread recording it, the graph allocations
// still alive, and the older allocations released meanwhile (the graph keeps them).
struct Capture {
  struct GraphAllocation {
    size_t bytes;
    std::shared_ptr<AllocationState> state;
  };
  std::thread::id owner;
  std::unordered_map<void*, GraphAllocation> graph_allocations;
  std::vector<std::pair<void*, size_t>> released;
};

struct Context {
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  std::atomic<size_t> in_use{0}, peak{0};
  std::atomic<uint64_t> allocations{0};
  // Capture state, under capture_mutex (with every AllocationState).
  std::mutex capture_mutex;
  std::condition_variable capture_done;
  Capture* capture = nullptr;
  // The capturing thread, read without the lock by every stream() call (the default id while
  // nothing captures); set and cleared under capture_mutex with `capture`.
  std::atomic<std::thread::id> capture_owner{};
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

// The calling thread's turn on the stream: a held lock under which it enqueues. Work another
// thread put on the stream while a capture records would join the graph, so another thread's
// capture is waited out first; and since begin() takes the same lock to start one, none can
// start between this check and the enqueue. (Checked and released before the enqueue, as it
// was, a loader thread's upload that lost that race became a node of the graph: every replay
// copied a reused pinned-ring slot into memory the pool had since given to other arrays.)
// The capturing thread gets its turn at once (its work is recorded), unless its call cannot
// be replayed (`unreplayable`: a read to the host, an upload, a wait), which throws.
std::unique_lock<std::mutex> stream_turn(Context& c, const char* unreplayable = nullptr, size_t bytes = 0) {
  std::unique_lock<std::mutex> lock(c.capture_mutex);
  if (c.capture && c.capture->owner == std::this_thread::get_id()) {
    if (unreplayable)
      throw Error(detail::concat("[cuda graphs] ", unreplayable,
                                 bytes ? detail::concat(" of ", bytes, " bytes") : std::string(),
                                 " inside a captured step: a graph replays its work as recorded, so the step must "
                                 "neither read to the host nor upload nor wait; it runs eagerly instead"));
    return lock;
  }
  c.capture_done.wait(lock, [&] { return c.capture == nullptr; });
  return lock;
}

// Waits, outside any turn, for the work enqueued before `record` ran (an event is no stream
// operation: another thread may begin a capture meanwhile).
void wait_for_recorded(Context& c, std::unique_lock<std::mutex>& turn, const char* what) {
  struct ThreadEvent {
    cudaEvent_t event = nullptr;
    ~ThreadEvent() {
      if (event) cudaEventDestroy(event);
    }
  };
  thread_local ThreadEvent done;
  if (!done.event) check(cudaEventCreateWithFlags(&done.event, cudaEventDisableTiming), what);
  check(cudaEventRecord(done.event, c.stream), what);
  turn.unlock();
  check(cudaEventSynchronize(done.event), what);
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
    std::unique_lock<std::mutex> turn = stream_turn(c);
    const bool capturing = c.capture != nullptr;
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes == 0 ? 1 : bytes, c.pool, c.stream);
    if (e != cudaSuccess) {
      turn.unlock();
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
    auto state = std::make_shared<AllocationState>();
    if (capturing) c.capture->graph_allocations[p] = {bytes, state};
    turn.unlock();
    Context* cp = &c;
    return std::shared_ptr<void>(p, [cp, bytes, state](void* q) {
      cp->in_use.fetch_sub(bytes);
      // Under the lock, like every enqueue: a free that lost a race with begin() would be a
      // free node, in another thread's graph, of memory the graph never allocated.
      std::lock_guard<std::mutex> lock(cp->capture_mutex);
      if (state->graph_owned) return;  // a StepGraph's output: the graph frees it
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
      // Ordered after every kernel already enqueued that reads it. A failure (the runtime
      // shutting down at exit) is cleared, not left for the next launch check.
      if (cudaFreeAsync(q, cp->stream) != cudaSuccess) cudaGetLastError();
    });
  }
  void copy_to_host(void* host, const void* device, size_t bytes) const override {
    Context& c = context();
    std::unique_lock<std::mutex> turn = stream_turn(c, "a read to the host", bytes);
    check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, c.stream), "copy to host");
    wait_for_recorded(c, turn, "copy to host (a kernel before it failed)");
  }
  void copy_from_host(void* device, const void* host, size_t bytes) const override {
    // Through the pinned ring (batches, small arrays): returns at once. Larger copies go from
    // pageable memory; the call returns once `host` has been read (staged by the driver).
    Context& c = context();
    const std::unique_lock<std::mutex> turn = stream_turn(c, "an upload", bytes);
    if (staging().copy(device, host, bytes, c.stream)) return;
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, c.stream), "copy to device");
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) const override {
    Context& c = context();
    const std::unique_lock<std::mutex> turn = stream_turn(c);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c.stream), "device copy");
  }
  void fill_bytes(void* device, const void* pattern, size_t pattern_bytes, size_t count) const override {
    const std::unique_lock<std::mutex> turn = stream_turn(context());
    fill_pattern(device, pattern, pattern_bytes, count);
  }
  void synchronize() const override {
    if (Context* existing = g_context.load(std::memory_order_acquire)) {
      // Bound first: a thread whose first GPU call this is would otherwise make its cached
      // event on device 0 (a process on cuda:N, N > 0, would then fail every wait).
      Context& c = bound_context(existing->device);
      std::unique_lock<std::mutex> turn = stream_turn(c, "a wait for the stream");
      wait_for_recorded(c, turn, "synchronize");
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
  // The pool's reservation and the captured graphs' (graph memory is reserved apart from it).
  static size_t reserved(Context& c) {
    uint64_t r = 0, graphs = 0;
    if (cudaMemPoolGetAttribute(c.pool, cudaMemPoolAttrReservedMemCurrent, &r) != cudaSuccess) cudaGetLastError();
    if (cudaDeviceGetGraphMemAttribute(c.device, cudaGraphMemAttrReservedMemCurrent, &graphs) != cudaSuccess)
      cudaGetLastError();
    return size_t(r + graphs);
  }
};

}  // namespace

cudaStream_t stream() {
  Context& c = context();
  // Work that another thread puts on the stream while the training thread captures is recorded
  // into the step's graph (the capture takes everything on its stream) and then replayed every
  // step: a clear error instead. Uploads, copies and frees take the stream turn and wait for
  // the capture to end; kernels and libraries come here. Checked under the lock where a capture
  // may be on, so the end of a capture (under the same lock) is never mistaken for it.
  const std::thread::id owner = c.capture_owner.load(std::memory_order_acquire);
  if (owner != std::thread::id() && owner != std::this_thread::get_id()) {
    std::lock_guard<std::mutex> lock(c.capture_mutex);
    MT_CHECK(c.capture == nullptr || c.capture->owner == std::this_thread::get_id(),
             "[cuda graphs] a thread other than the one capturing the training step launched GPU work during the "
             "capture; it would be recorded into the step's graph and replayed at every step. Build batches on the "
             "host (a collate that returns host arrays; the loader uploads them) or run that work outside the step");
  }
  return c.stream;
}

namespace capture_hooks {

void begin() {
  Context& c = context();
  // Under the lock every other thread's enqueue takes (stream_turn): none is half-way between
  // its check and its enqueue when the capture starts. Thread-local mode: this thread may not
  // call what a capture cannot hold (cudaMalloc, a synchronization).
  std::lock_guard<std::mutex> lock(c.capture_mutex);
  MT_CHECK(c.capture == nullptr, "[cuda graphs] a capture is already recording");
  // A graph's allocations come from CUDA's graph memory, not from this pool, whose release
  // threshold keeps every block the eager warm-up steps freed: given back first, so that the
  // graph's activations do not need the device's memory a second time beside them.
  if (cudaStreamSynchronize(c.stream) != cudaSuccess || cudaMemPoolTrimTo(c.pool, 0) != cudaSuccess)
    cudaGetLastError();
  const cudaError_t e = cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw_cuda_error(e, "cudaStreamBeginCapture");
  }
  c.capture = new Capture{std::this_thread::get_id(), {}, {}};
  c.capture_owner.store(std::this_thread::get_id(), std::memory_order_release);
}

Ended end(bool keep) {
  Context& c = context();
  Ended out;
  std::unique_ptr<Capture> k;
  cudaError_t e = cudaSuccess;
  {
    // Ended under the lock that stream() checks another thread's launch under: no launch sees
    // the capture on after it ended.
    std::lock_guard<std::mutex> lock(c.capture_mutex);
    e = cudaStreamEndCapture(c.stream, &out.graph);
    if (e != cudaSuccess) {
      cudaGetLastError();
      out.graph = nullptr;
    }
    k.reset(c.capture);
    c.capture = nullptr;
    c.capture_owner.store(std::thread::id(), std::memory_order_release);
    // The allocations still held: the graph's outputs (or, for a capture given up, addresses
    // that never held memory): their handles free nothing.
    for (const auto& [p, allocation] : k->graph_allocations) {
      allocation.state->graph_owned = true;
      out.outputs.push_back(p);
      out.bytes += allocation.bytes;
    }
    c.capture_done.notify_all();
  }
  const bool kept = keep && out.graph != nullptr;
  const std::unique_lock<std::mutex> turn = stream_turn(c);
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
  // replay. Their handles, graph-owned since the capture ended, free nothing either way.
  const std::unique_lock<std::mutex> turn = stream_turn(c);
  if (launched) {
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
