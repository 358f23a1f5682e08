#include "meshtrain/backend/cuda/pinned_staging.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "meshtrain/backend/cuda/cuda_common.h"

namespace mt::cuda {

namespace {
constexpr size_t kAlign = 256;  // DMA-friendly starts
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

PinnedStaging::PinnedStaging(size_t capacity) : capacity_(capacity) {}

PinnedStaging::~PinnedStaging() {
  for (Span& s : in_flight_) {
    cudaEventSynchronize(s.copied);
    cudaEventDestroy(s.copied);
  }
  if (ring_) cudaFreeHost(ring_);
  cudaGetLastError();
}

size_t PinnedStaging::configured_capacity() {
  const char* env = std::getenv("MT_PINNED_STAGING_MB");
  if (!env || !*env) return size_t(64) << 20;
  char* end = nullptr;
  const long mb = std::strtol(env, &end, 10);
  return *end == '\0' && mb > 0 ? size_t(mb) << 20 : 0;
}

void PinnedStaging::release_completed() {
  while (!in_flight_.empty()) {
    Span& s = in_flight_.front();
    if (cudaEventQuery(s.copied) != cudaSuccess) {
      cudaGetLastError();  // cudaErrorNotReady is not an error here; a failed copy shows at the next sync
      return;
    }
    cudaEventDestroy(s.copied);
    in_flight_.pop_front();
  }
}

bool PinnedStaging::copy(void* device, const void* host, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || bytes > capacity_ / 4) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (unavailable_) return false;
  if (!ring_) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, capacity_, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      unavailable_ = true;  // no pinned memory to spare: pageable copies still work
      return false;
    }
    ring_ = static_cast<char*>(p);
  }
  const size_t n = aligned(bytes);
  release_completed();
  if (in_flight_.empty()) head_ = 0;  // nothing queued: start over at the front
  if (head_ + n > capacity_) head_ = 0;  // wrap; the tail stays unused this lap
  // [head_, head_ + n) must be free. After a wrap the oldest spans may sit in the unused tail
  // while newer ones are in the way, so every span is checked. A ring full of queued copies
  // means the GPU is behind: the caller copies from its own memory rather than wait here,
  // under the lock, for the GPU to drain.
  auto overlaps = [&](const Span& s) { return s.offset < head_ + n && head_ < s.offset + s.bytes; };
  if (std::any_of(in_flight_.begin(), in_flight_.end(), overlaps)) return false;
  cudaEvent_t copied = nullptr;
  check(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), "cudaEventCreate");
  std::memcpy(ring_ + head_, host, bytes);
  cudaError_t e = cudaMemcpyAsync(device, ring_ + head_, bytes, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaEventRecord(copied, stream);
  if (e != cudaSuccess) {
    // An untracked copy may still read the span: let it finish before the ring is reused.
    cudaStreamSynchronize(stream);
    cudaEventDestroy(copied);
    throw_cuda_error(e, "copy to device");
  }
  in_flight_.push_back({head_, n, copied});
  head_ += n;
  return true;
}

}  // namespace mt::cuda
