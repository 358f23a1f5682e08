// The GPU runtime behind core/device.h: one compute stream on the process's GPU, memory from
// a stream-ordered pool (cudaMallocAsync) that keeps freed blocks cached (release threshold
// = everything), so after warm-up no step reaches cudaMalloc; copies and fills on the stream.
#include <atomic>
#include <cstring>
#include <mutex>

#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/pinned_staging.h"
#include "meshtrain/core/device.h"

namespace mt::cuda {

namespace {

struct Context {
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  std::atomic<size_t> in_use{0}, peak{0};
  std::atomic<uint64_t> allocations{0};
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
    Context* cp = &c;
    return std::shared_ptr<void>(p, [cp, bytes](void* q) {
      cp->in_use.fetch_sub(bytes);
      // Ordered after every kernel already enqueued that reads it. A failure (the runtime
      // shutting down at exit) is cleared, not left for the next launch check.
      if (cudaFreeAsync(q, cp->stream) != cudaSuccess) cudaGetLastError();
    });
  }
  void copy_to_host(void* host, const void* device, size_t bytes) const override {
    Context& c = context();
    check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, c.stream), "copy to host");
    check(cudaStreamSynchronize(c.stream), "copy to host (a kernel before it failed)");
  }
  void copy_from_host(void* device, const void* host, size_t bytes) const override {
    // Through the pinned ring (batches, small arrays): returns at once. Larger copies go from
    // pageable memory; the call returns once `host` has been read (staged by the driver).
    Context& c = context();
    if (staging().copy(device, host, bytes, c.stream)) return;
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, c.stream), "copy to device");
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) const override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, context().stream), "device copy");
  }
  void fill_bytes(void* device, const void* pattern, size_t pattern_bytes, size_t count) const override {
    fill_pattern(device, pattern, pattern_bytes, count);
  }
  void synchronize() const override {
    if (Context* c = g_context.load(std::memory_order_acquire)) check(cudaStreamSynchronize(c->stream), "synchronize");
  }
  DeviceMemoryStats memory_stats(int index) const override {
    Context& c = context_for(index);
    return {c.in_use.load(), c.peak.load(), reserved(c), c.allocations.load()};
  }
  void reset_peak(int index) const override {
    Context& c = context_for(index);
    c.peak.store(c.in_use.load());
  }

 private:
  static size_t reserved(Context& c) {
    uint64_t r = 0;
    if (cudaMemPoolGetAttribute(c.pool, cudaMemPoolAttrReservedMemCurrent, &r) != cudaSuccess) cudaGetLastError();
    return size_t(r);
  }
};

}  // namespace

cudaStream_t stream() { return context().stream; }
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
