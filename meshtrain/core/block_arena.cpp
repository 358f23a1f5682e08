#include "meshtrain/core/block_arena.h"

#include <sys/mman.h>

#include <algorithm>

namespace mt {

namespace {
constexpr size_t kMinReserve = size_t(1) << 30;
// Address space is made writable in steps this large, so mprotect calls stay rare.
constexpr size_t kCommitStep = size_t(64) << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
}  // namespace

BlockArena::BlockArena(size_t reserve_bytes) {
  // PROT_NONE reserves addresses without committing memory, so even a strict overcommit
  // policy accepts it; pages become writable (and counted) only as the top grows.
  for (size_t size = round_up(reserve_bytes, kCommitStep); size >= kMinReserve; size /= 2) {
    void* p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
      base_ = static_cast<char*>(p);
      reserved_ = size;
      return;
    }
  }
}

bool BlockArena::grow_top(size_t bytes) {
  if (top_ + bytes > reserved_) return false;
  if (top_ + bytes > committed_) {
    const size_t target = std::min(reserved_, round_up(top_ + bytes, kCommitStep));
    if (mprotect(base_ + committed_, target - committed_, PROT_READ | PROT_WRITE) != 0) return false;
    committed_ = target;
  }
  top_ += bytes;
  return true;
}

BlockArena::Block* BlockArena::split(Block* block, size_t size) {
  // The tail stays free; the head, of `size` bytes, is handed out.
  if (block->size > size) {
    Block* rest = new Block{block->address + size, block->size - size, true, block, block->next,
                            block->discarded};
    if (block->next) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    if (last_ == block) last_ = rest;
    free_.insert(rest);
    free_bytes_ += rest->size;
  }
  block->free = false;
  return block;
}

BlockArena::Block* BlockArena::allocate(size_t bytes) {
  if (!base_) return nullptr;
  const size_t size = round_up(std::max<size_t>(bytes, 1), kGranule);
  Block key{nullptr, size, true, nullptr, nullptr};
  auto it = free_.lower_bound(&key);
  if (it != free_.end()) {
    Block* block = *it;
    take_free(block);
    return split(block, size);
  }
  // Nothing fits, so the top grows. The free blocks were too small for this request; were
  // their pages kept, the resident memory would be live bytes plus these holes. Given back,
  // a later request that fits one faults its pages in again (zero-filled), which happens
  // only while the peak is still being found: steady steps do not grow the top.
  discard_before_growth(last_ && last_->free ? last_ : nullptr);
  // A free block at the top only needs the difference.
  if (last_ && last_->free) {
    if (!grow_top(size - last_->size)) return nullptr;
    take_free(last_);
    last_->size = size;
    last_->free = false;
    return last_;
  }
  char* address = base_ + top_;
  if (!grow_top(size)) return nullptr;
  Block* block = new Block{address, size, false, last_, nullptr};
  if (last_) last_->next = block;
  last_ = block;
  return block;
}

void BlockArena::take_free(Block* block) {
  free_.erase(block);  // before any change of its size: the set is ordered by it
  free_bytes_ -= block->size;
}

void BlockArena::absorb_next(Block* left) {
  Block* right = left->next;
  left->size += right->size;
  left->discarded = left->discarded && right->discarded;
  left->next = right->next;
  if (right->next) right->next->prev = left;
  if (last_ == right) last_ = left;
  delete right;
}

void BlockArena::release(Block* block) {
  block->free = true;
  block->discarded = false;
  // Merge with free neighbours, so the freed space can serve a larger request later.
  if (Block* next = block->next; next && next->free) {
    take_free(next);
    absorb_next(block);
  }
  if (Block* prev = block->prev; prev && prev->free) {
    take_free(prev);
    absorb_next(prev);
    block = prev;
  }
  free_.insert(block);
  free_bytes_ += block->size;
}

void BlockArena::discard_before_growth(const Block* keep) {
  for (Block* block : free_) {
    if (block == keep || block->discarded || block->size < kDiscardMin) continue;
    madvise(block->address, block->size, MADV_DONTNEED);
    block->discarded = true;
    discarded_on_growth_ += block->size;
  }
}

void BlockArena::discard_free_pages() {
  for (Block* block : free_) {
    madvise(block->address, block->size, MADV_DONTNEED);
    block->discarded = true;
  }
}

}  // namespace mt
