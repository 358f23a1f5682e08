#pragma once
// Two CUDA events that time the work enqueued between them on a stream, owned (destroyed with
// the object, which moves). Where a choice is made by measurement: cuBLASLt's candidate
// algorithms (matmul.cpp's tuning) and MT_ATTENTION_CUDNN=auto's routes (cudnn_attention.cpp).
#include <cuda_runtime.h>

#include <utility>

#include "meshtrain/backend/cuda/cuda_common.h"

namespace mt::cuda {

class TimingEvents {
 public:
  // `what` names the caller in errors (a string that outlives the object).
  explicit TimingEvents(const char* what) : what_(what) {
    check(cudaEventCreate(&start_), what_);
    const cudaError_t made = cudaEventCreate(&stop_);
    if (made != cudaSuccess) {
      cudaEventDestroy(start_);
      check(made, what_);
    }
  }
  TimingEvents(TimingEvents&& o) noexcept
      : start_(std::exchange(o.start_, nullptr)), stop_(std::exchange(o.stop_, nullptr)), what_(o.what_) {}
  TimingEvents(const TimingEvents&) = delete;
  TimingEvents& operator=(const TimingEvents&) = delete;
  TimingEvents& operator=(TimingEvents&&) = delete;
  ~TimingEvents() {
    if (start_) cudaEventDestroy(start_);
    if (stop_) cudaEventDestroy(stop_);
  }

  void start(cudaStream_t s) { check(cudaEventRecord(start_, s), what_); }
  void stop(cudaStream_t s) { check(cudaEventRecord(stop_, s), what_); }
  // Waits for the stop event: the milliseconds between the two.
  float elapsed_ms() const {
    check(cudaEventSynchronize(stop_), what_);
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start_, stop_), what_);
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  const char* what_;
};

}  // namespace mt::cuda
