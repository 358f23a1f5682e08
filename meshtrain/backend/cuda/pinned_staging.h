#pragma once
// Host-to-device copies through a ring of page-locked host memory. From ordinary (pageable)
// memory the driver stages a copy itself and may first wait for the stream to reach it, so a
// data-loader thread collating the next batch would wait for the step in flight. Here the
// bytes go into the ring (a memcpy) and the DMA is enqueued from there: the call returns at
// once, the caller's buffer is free again, and the batch is on the GPU before the step that
// reads it. A span of the ring is reused once the event recorded after its copy has completed;
// when the ring is full of copies still queued, the caller copies from its own memory instead
// of waiting.
#include <cuda_runtime.h>

#include <cstddef>
#include <deque>
#include <mutex>

namespace mt::cuda {

class PinnedStaging {
 public:
  // `capacity` bytes of pinned memory, taken at the first copy; 0 disables the ring.
  explicit PinnedStaging(size_t capacity);
  ~PinnedStaging();  // waits for the queued copies, then frees the ring
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // Enqueues the copy of `bytes` from `host` to `device` on `stream` through the ring and
  // returns true, or returns false (nothing done) for copies larger than a quarter of the ring,
  // when the ring has no free span that large, or when it is disabled or cannot be allocated:
  // the caller copies from `host` itself.
  bool copy(void* device, const void* host, size_t bytes, cudaStream_t stream);

  // MT_PINNED_STAGING_MB (default 64; 0 turns staging off).
  static size_t configured_capacity();

 private:
  struct Span {
    size_t offset, bytes;
    cudaEvent_t copied;
  };
  void release_completed();  // drops the spans whose copies are done, oldest first

  std::mutex mu_;
  size_t capacity_;
  char* ring_ = nullptr;
  bool unavailable_ = false;
  size_t head_ = 0;
  std::deque<Span> in_flight_;  // oldest first: they occupy the ring from front.offset to head_
};

}  // namespace mt::cuda
