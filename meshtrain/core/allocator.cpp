#include "meshtrain/core/allocator.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace mt {

struct CachingAllocator::Impl {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_lists;  // bucket size -> blocks
  AllocatorStats stats;
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
  size_t size = bucket_size(bytes);
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    auto it = s->free_lists.find(size);
    if (it != s->free_lists.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      s->stats.cache_hits++;
      s->stats.bytes_cached -= size;
    } else {
      s->stats.os_allocations++;
    }
    s->stats.bytes_in_use += size;
    if (s->stats.bytes_in_use > s->stats.peak_bytes_in_use) s->stats.peak_bytes_in_use = s->stats.bytes_in_use;
  }
  if (!ptr) {
    ptr = std::aligned_alloc(kAlignment, size);
    if (!ptr) {
      release_cached();
      ptr = std::aligned_alloc(kAlignment, size);
    }
    if (!ptr) throw std::bad_alloc();
  }
  return std::shared_ptr<void>(ptr, [s, size](void* p) {
    std::lock_guard<std::mutex> lock(s->mutex);
    s->free_lists[size].push_back(p);
    s->stats.bytes_in_use -= size;
    s->stats.bytes_cached += size;
  });
}

AllocatorStats CachingAllocator::stats() const {
  Impl* s = const_cast<CachingAllocator*>(this)->impl();
  std::lock_guard<std::mutex> lock(s->mutex);
  return s->stats;
}

void CachingAllocator::release_cached() {
  Impl* s = impl();
  std::lock_guard<std::mutex> lock(s->mutex);
  for (auto& [size, blocks] : s->free_lists) {
    for (void* p : blocks) std::free(p);
    blocks.clear();
  }
  s->stats.bytes_cached = 0;
}

void CachingAllocator::reset_peak() {
  Impl* s = impl();
  std::lock_guard<std::mutex> lock(s->mutex);
  s->stats.peak_bytes_in_use = s->stats.bytes_in_use;
}

}  // namespace mt
