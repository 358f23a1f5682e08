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
// Steady-state steps do not fault: a free block keeps its pages for the next request. But when
// nothing free fits and the top must grow, the free blocks' pages go back to the OS first
// (see allocate), so the resident memory is the peak of live bytes, not live bytes plus the
// holes that were too small for the request that grew the top.
// Not thread-safe; the caching allocator holds its lock around every call.
class BlockArena {
 public:
  struct Block {
    char* address;
    size_t size;
    bool free;
    Block* prev;  // neighbours in address order
    Block* next;
    bool discarded = false;  // free, and its pages already given back to the OS
  };

  // Reserves `reserve_bytes` of address space (no memory yet); if the system refuses, halves
  // it down to 1 GiB; below that the arena stays empty and every allocate() returns nullptr.
  explicit BlockArena(size_t reserve_bytes);
  // Never destroyed in practice: the allocator that owns it is leaked (arrays may die after
  // main returns), so the reserved range simply ends with the process.

  static constexpr size_t kGranule = 4096;  // block sizes and addresses are page multiples

  // Free blocks at least this large give their pages back when the top grows.
  static constexpr size_t kDiscardMin = size_t(1) << 20;

  // A block of at least `bytes` (rounded up to kGranule), or nullptr when the reservation is
  // spent or the system refuses to commit more. When no free block fits, the pages of the
  // free blocks (of kDiscardMin or more) are given back before the top grows.
  Block* allocate(size_t bytes);
  void release(Block* block);

  size_t reserved() const { return reserved_; }
  size_t top() const { return top_; }  // bytes of the range ever carved
  size_t free_bytes() const { return free_bytes_; }
  size_t free_blocks() const { return free_.size(); }
  // Returns the pages of free blocks to the OS (they read as zeros when touched again).
  void discard_free_pages();
  // Bytes of free blocks given back by allocate() when the top grew, over the arena's life.
  size_t discarded_on_growth() const { return discarded_on_growth_; }

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
  void discard_before_growth(const Block* keep);  // all large free blocks but `keep`

  char* base_ = nullptr;
  size_t reserved_ = 0;
  size_t top_ = 0;
  size_t committed_ = 0;  // bytes made readable and writable, a prefix of the range
  size_t free_bytes_ = 0;
  size_t discarded_on_growth_ = 0;
  Block* last_ = nullptr;  // the block ending at top_
  std::set<Block*, BySizeThenAddress> free_;
};

}  // namespace mt
