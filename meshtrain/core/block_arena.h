#pragma once
#include <cstddef>
#include <cstdint>
#include <set>

namespace mt {

// Large blocks carved out of one reserved range of virtual addresses. An allocation takes the
// smallest free block that fits (best fit, lowest address among equals) and splits off the
// rest; a release merges the block with its free neighbours. Only when nothing free fits does
// the used top of the range grow. So the pages ever touched — the resident memory — follow
// the peak of live bytes, where a cache of exact-size blocks holds the sum of every size's
// own peak (a training step's sizes differ from layer to layer and phase to phase).
// Pages are never given back while in use by the cache: steady-state steps do not fault.
// Not thread-safe; the caching allocator holds its lock around every call.
class BlockArena {
 public:
  struct Block {
    char* address;
    size_t size;
    bool free;
    Block* prev;  // neighbours in address order
    Block* next;
  };

  // Reserves `reserve_bytes` of address space (no memory yet); if the system refuses, halves
  // it down to 1 GiB; below that the arena stays empty and every allocate() returns nullptr.
  explicit BlockArena(size_t reserve_bytes);
  // Never destroyed in practice: the allocator that owns it is leaked (arrays may die after
  // main returns), so the reserved range simply ends with the process.

  static constexpr size_t kGranule = 4096;  // block sizes and addresses are page multiples

  // A block of at least `bytes` (rounded up to kGranule), or nullptr when the reservation is
  // spent or the system refuses to commit more.
  Block* allocate(size_t bytes);
  void release(Block* block);

  size_t reserved() const { return reserved_; }
  size_t top() const { return top_; }  // bytes of the range ever carved
  size_t free_bytes() const { return free_bytes_; }
  size_t free_blocks() const { return free_.size(); }
  // Returns the pages of free blocks to the OS (they read as zeros when touched again).
  void discard_free_pages();

 private:
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->address < b->address;
    }
  };
  bool grow_top(size_t bytes);  // makes [top_, top_ + bytes) usable
  Block* split(Block* block, size_t size);
  void take_free(Block* block);    // out of the free set
  void absorb_next(Block* left);   // left's next neighbour becomes part of left

  char* base_ = nullptr;
  size_t reserved_ = 0;
  size_t top_ = 0;
  size_t committed_ = 0;  // bytes made readable and writable, a prefix of the range
  size_t free_bytes_ = 0;
  Block* last_ = nullptr;  // the block ending at top_
  std::set<Block*, BySizeThenAddress> free_;
};

}  // namespace mt
