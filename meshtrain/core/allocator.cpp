#include "meshtrain/core/allocator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "meshtrain/core/block_arena.h"

namespace mt {

namespace {
// Twice the machine's memory: the arena's address space, not memory it uses.
size_t arena_reservation() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const size_t physical = pages > 0 && page > 0 ? size_t(pages) * size_t(page) : size_t(16) << 30;
  return std::max<size_t>(2 * physical, size_t(8) << 30);
}
}  // namespace

struct CachingAllocator::Impl {
  std::mutex mutex;
  // Blocks up to kLargeBlock: cached per bucket size (cheap, and their total stays small).
  std::unordered_map<size_t, std::vector<void*>> free_lists;
  size_t bucket_cached_bytes = 0;
  size_t bucket_in_use = 0, bucket_peak_in_use = 0;
  // Larger blocks: split from and merged back into one arena (see block_arena.h).
  BlockArena arena{arena_reservation()};
  AllocatorStats stats;  // bytes_cached is filled in by stats()

  void count_allocation(size_t size) {
    stats.bytes_in_use += size;
    stats.peak_bytes_in_use = std::max(stats.peak_bytes_in_use, stats.bytes_in_use);
  }
  void count_bucketed(size_t size, bool small) {
    count_allocation(size);
    if (!small) return;
    bucket_in_use += size;
    bucket_peak_in_use = std::max(bucket_peak_in_use, bucket_in_use);
  }
};

CachingAllocator::Impl* CachingAllocator::impl() {
  // Leaked on purpose: arrays held by static objects may be freed after main returns.
  static Impl* impl = new Impl();
  return impl;
}

CachingAllocator& CachingAllocator::instance() {
  static CachingAllocator allocator;
  return allocator;
}

size_t CachingAllocator::bucket_size(size_t bytes) {
  // Small blocks round to 64 bytes; larger ones to one of 8 steps per power of two, which
  // bounds waste to 12.5% while letting slightly different sizes share blocks.
  if (bytes <= 4096) return std::max<size_t>(kAlignment, (bytes + kAlignment - 1) & ~(kAlignment - 1));
  size_t pow2 = size_t(1) << (63 - __builtin_clzll(bytes));
  size_t step = pow2 / 8;
  return (bytes + step - 1) / step * step;
}

std::shared_ptr<void> CachingAllocator::allocate(size_t bytes) {
  Impl* s = impl();
  if (bytes > kLargeBlock) {
    std::lock_guard<std::mutex> lock(s->mutex);
    const size_t top_before = s->arena.top();
    if (BlockArena::Block* block = s->arena.allocate(bytes)) {
      (s->arena.top() > top_before ? s->stats.os_allocations : s->stats.cache_hits)++;
      s->count_allocation(block->size);
      return std::shared_ptr<void>(block->address, [s, block, size = block->size](void*) {
        std::lock_guard<std::mutex> lock(s->mutex);
        s->stats.bytes_in_use -= size;
        s->arena.release(block);
      });
    }
    // The arena's address space is spent (or was never granted): a bucketed block instead.
  }
  const size_t size = bucket_size(bytes);
  // Only the requests buckets are for count toward their peak: a large block that fell back
  // here (the arena spent) would otherwise lift the bound for good.
  const bool small = bytes <= kLargeBlock;
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    auto it = s->free_lists.find(size);
    if (it != s->free_lists.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      s->stats.cache_hits++;
      s->bucket_cached_bytes -= size;
      s->count_bucketed(size, small);
    }
  }
  if (!ptr) {
    ptr = std::aligned_alloc(kAlignment, size);
    if (!ptr) {
      release_cached();
      ptr = std::aligned_alloc(kAlignment, size);
    }
    if (!ptr) throw std::bad_alloc();  // counted nothing: the peaks stay what was really used
    std::lock_guard<std::mutex> lock(s->mutex);
    s->stats.os_allocations++;
    s->count_bucketed(size, small);
  }
  return std::shared_ptr<void>(ptr, [s, size, small](void* p) {
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      s->stats.bytes_in_use -= size;
      if (small) s->bucket_in_use -= size;
      if (s->bucket_cached_bytes + size <= bucket_cache_limit(s->bucket_peak_in_use)) {
        s->free_lists[size].push_back(p);
        s->bucket_cached_bytes += size;
        return;
      }
    }
    std::free(p);  // past the bound: malloc's free lists reuse it for any size
  });
}

size_t CachingAllocator::bucket_cache_limit(size_t bucket_peak_bytes_in_use) {
  return std::max(kMinBucketCache, 2 * bucket_peak_bytes_in_use);
}

AllocatorStats CachingAllocator::stats() const {
  Impl* s = const_cast<CachingAllocator*>(this)->impl();
  std::lock_guard<std::mutex> lock(s->mutex);
  AllocatorStats out = s->stats;
  out.bytes_cached = s->bucket_cached_bytes + s->arena.free_bytes();
  out.bytes_reserved = out.bytes_in_use + out.bytes_cached;
  out.bucket_bytes_cached = s->bucket_cached_bytes;
  out.bucket_peak_bytes_in_use = s->bucket_peak_in_use;
  return out;
}

void CachingAllocator::release_cached() {
  Impl* s = impl();
  std::lock_guard<std::mutex> lock(s->mutex);
  for (auto& [size, blocks] : s->free_lists) {
    for (void* p : blocks) std::free(p);
    blocks.clear();
  }
  s->bucket_cached_bytes = 0;
  s->arena.discard_free_pages();
}

void CachingAllocator::reset_peak() {
  Impl* s = impl();
  std::lock_guard<std::mutex> lock(s->mutex);
  s->stats.peak_bytes_in_use = s->stats.bytes_in_use;
}

}  // namespace mt
