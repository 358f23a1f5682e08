#pragma once
// Where an array's buffer lives: the host (cpu) or one CUDA GPU. Placement is explicit, as in
// PyTorch: arrays are created on the current device, ops run where their inputs are, and an
// op whose inputs sit on different devices is an error naming both (no silent copies).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mt {

struct Device {
  enum class Kind : uint8_t { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  bool operator==(const Device& o) const { return kind == o.kind && (kind == Kind::cpu || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu", "cuda:0"

  // "cpu", "cuda", "cuda:N", or "auto" (a GPU when one is visible, else the CPU). "cuda" and
  // "auto" pick local_gpu_index(): under mpirun, one process per GPU.
  // Throws mt::Error naming the text, and for a GPU that is not there (or a build without
  // CUDA) what is available.
  static Device parse(const std::string& text);
};

// The GPU "cuda" means in this process, of `device_count`: the process's rank among those on
// its host (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID) modulo the count, so
// processes launched together spread over the host's GPUs (and share them round-robin when
// there are more processes than GPUs); 0 outside a launcher.
int local_gpu_index(int device_count);

// The device new arrays are created on: a DeviceScope's device on this thread if one is
// active, else the process default (the CPU until set_default_device).
Device current_device();
Device default_device();
void set_default_device(Device device);

// Makes `device` current on this thread for its lifetime (the dispatcher runs each kernel
// under its inputs' device, so the kernel's outputs land beside them).
class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  bool had_previous_;
  Device previous_;
};

// Memory statistics of one GPU's caching allocator.
struct DeviceMemoryStats {
  size_t bytes_in_use = 0;       // held by live arrays
  size_t peak_bytes_in_use = 0;  // since the last reset_peak
  size_t bytes_reserved = 0;     // taken from the driver by the pool (in use + cached)
  uint64_t allocations = 0;      // requests served
};

// Device work recorded once and replayed by one launch (a CUDA graph: backend/cuda/step_graph.h
// says what a capture keeps and refuses). The Trainer's captured step is built on it.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  virtual void replay() = 0;  // enqueues one run after the work already queued
  virtual size_t nodes() const = 0;
  virtual size_t kept_bytes() const = 0;  // the static inputs and outputs it owns
};

// Device work as the device timed it, for the profiler's GPU track: a kernel, a copy or a fill.
struct DeviceSpan {
  std::string name;             // the kernel's function name; "memcpy HtoD", "memset", ...
  const char* kind = "kernel";  // "kernel", "memcpy" or "memset"
  double start_us = 0, dur_us = 0;  // on trace::now_us()'s time base
  double bytes = 0;                 // copies and fills
  uint32_t graph = 0;  // the CUDA graph whose replay ran it (0: launched on its own)
};

// What core needs from a GPU runtime: memory, copies and captured work. Implemented by backend/cuda (or by
// its no-CUDA stand-in, which reports no GPUs and fails every call with a clear message).
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual int device_count() const = 0;  // 0 without a GPU or without CUDA in the build
  virtual std::string describe(int index) const = 0;  // "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)"
  // Stream-ordered device memory; throws mt::Error (out of memory: what is in use and
  // reserved) — the caller adds the array's shape.
  virtual std::shared_ptr<void> allocate(int index, size_t bytes) const = 0;
  virtual void copy_to_host(void* host, const void* device, size_t bytes) const = 0;  // waits for the result
  virtual void copy_from_host(void* device, const void* host, size_t bytes) const = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) const = 0;
  virtual void fill_bytes(void* device, const void* pattern, size_t pattern_bytes, size_t count) const = 0;
  virtual void synchronize() const = 0;  // waits for every kernel enqueued so far
  virtual DeviceMemoryStats memory_stats(int index) const = 0;
  virtual void reset_peak(int index) const = 0;
  // Records what `record` enqueues on the stream (nothing runs until the first replay); throws
  // mt::Error naming what could not be captured, and the stream then works eagerly again.
  virtual std::unique_ptr<CapturedWork> capture(const std::function<void()>& record) const = 0;
  virtual bool capturing() const = 0;  // the calling thread is recording a capture
  // Starts timing every kernel, copy and fill on the device (CUPTI's activity records, also
  // for the nodes of replayed graphs): "" once started, else why it cannot be.
  virtual std::string start_device_trace() const = 0;
  // Waits for the device, stops timing and returns what ran since the start, by start time.
  virtual std::vector<DeviceSpan> stop_device_trace() const = 0;
};
// Defined by meshtrain/backend/cuda (device_runtime.cpp with CUDA, no_cuda.cpp without).
const DeviceRuntime& cuda_runtime();

// Waits for the device's queued work (a no-op on the CPU): before timing, or before a host
// thread reads device memory by another path.
void synchronize(Device device);

// The calling thread is recording device work for replay (DeviceRuntime::capture): host values
// it passes to kernels now are replayed unchanged, so code whose launch arguments change from
// step to step must refuse (or read them from device memory).
bool capturing_device_work();

}  // namespace mt
