#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace mt {

// Statistics of the caching allocator; `os_allocations` counts allocations that took new
// memory (a new bucketed block, or the arena's top growing), which must stay flat across
// training steps after warm-up.
struct AllocatorStats {
  uint64_t os_allocations = 0;
  uint64_t cache_hits = 0;
  size_t bytes_in_use = 0;
  size_t bytes_cached = 0;    // free but kept: bucketed blocks and the arena's free blocks
  size_t bytes_reserved = 0;  // bytes_in_use + bytes_cached
  size_t peak_bytes_in_use = 0;  // the most bytes_in_use has been since reset_peak()
  size_t bucket_bytes_cached = 0;     // the part of bytes_cached in bucketed (small) blocks
  size_t bucket_peak_bytes_in_use = 0;  // the most bucketed bytes ever in use at once
};

// Caching allocator with 64-byte alignment; freed memory is kept, not returned to the OS, so
// steady-state steps reuse it without page faults. Blocks up to kLargeBlock are cached per
// size bucket; larger ones are split from and merged back into one arena (block_arena.h), so
// the memory held follows the peak of live bytes rather than the sum of every size's peak.
// The bucketed blocks kept are bounded the same way (bucket_cache_limit): a loop whose sizes
// creep up — a KV cache concatenated one position at a time — would otherwise keep every
// size's blocks, the sum of every bucket's peak.
class CachingAllocator {
 public:
  static CachingAllocator& instance();
  // A block of at least `bytes` bytes, 64-byte aligned, freed when the last owner drops it.
  std::shared_ptr<void> allocate(size_t bytes);
  AllocatorStats stats() const;
  void release_cached();  // gives every cached block back to the OS
  void reset_peak();      // peak_bytes_in_use = bytes_in_use

  static constexpr size_t kAlignment = 64;
  static constexpr size_t kLargeBlock = size_t(256) << 10;
  static size_t bucket_size(size_t bytes);  // the size reserved for a bucketed request
  // Freed bucketed blocks are kept while the bytes kept stay within twice the most bucketed
  // bytes ever in use at once (at least kMinBucketCache); past that they go back to malloc.
  // A steady loop reuses what it freed; what no request could use at once is not kept.
  static constexpr size_t kMinBucketCache = size_t(32) << 20;
  static size_t bucket_cache_limit(size_t bucket_peak_bytes_in_use);

 private:
  CachingAllocator() = default;
  struct Impl;
  Impl* impl();
};

}  // namespace mt
