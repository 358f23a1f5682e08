#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace mt {

// Statistics of the caching allocator; `os_allocations` counts calls that reached the OS,
// which must stay flat across training steps after warm-up.
struct AllocatorStats {
  uint64_t os_allocations = 0;
  uint64_t cache_hits = 0;
  size_t bytes_in_use = 0;
  size_t bytes_cached = 0;
  size_t peak_bytes_in_use = 0;  // the most bytes_in_use has been since reset_peak()
};

// Size-bucketed caching allocator with 64-byte alignment. Freed blocks return to a
// per-bucket free list instead of the OS, so steady-state steps reuse them.
class CachingAllocator {
 public:
  static CachingAllocator& instance();
  // A block of at least `bytes` bytes, 64-byte aligned, freed when the last owner drops it.
  std::shared_ptr<void> allocate(size_t bytes);
  AllocatorStats stats() const;
  void release_cached();  // gives every cached block back to the OS
  void reset_peak();      // peak_bytes_in_use = bytes_in_use

  static constexpr size_t kAlignment = 64;
  static size_t bucket_size(size_t bytes);  // the size actually reserved for a request

 private:
  CachingAllocator() = default;
  struct Impl;
  Impl* impl();
};

}  // namespace mt
