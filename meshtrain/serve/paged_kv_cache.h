#pragma once
// The serving engine's KV memory: one block pool per layer (models::KvBlockPool), allocated
// uninitialized at the first prompt stored, with room for the whole --kv-cache-mb budget, and
// the blocks each sequence owns. A store, fork or step that fails leaves every sequence as
// it was and no block lost. A
// sequence takes a block when its length crosses a block boundary and gives all of them
// back when it leaves; freed blocks are reused first, so the memory the process touches
// stays that of the busiest moment. The pool's arrays are written in place: a decode step
// moves only the step's keys and values.
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "meshtrain/models/common.h"

namespace mt::serve {

class PagedKvCache {
 public:
  // `blocks` blocks of `block_size` positions per layer.
  PagedKvCache(int64_t blocks, int64_t block_size);

  // `seq`'s positions are the last `length` of row `row` of `prefilled` (an ordinary cache,
  // (B, Hkv, P, D) per layer; length 0 = all P), copied into new blocks.
  void store(int64_t seq, const models::KvCache& prefilled, int64_t row = 0, int64_t length = 0);
  // `to` starts as a copy of `from` (the choices of one prompt share its prefill).
  void fork(int64_t from, int64_t to);
  // The step that appends one position to each of `seqs`, in order; their lengths grow by one.
  models::PagedKvStep step(const std::vector<int64_t>& seqs);
  void drop(int64_t seq);

  int64_t length(int64_t seq) const;
  int64_t block_size() const { return pool_.block_size; }
  int64_t free_blocks() const { return int64_t(free_.size()); }
  // Bytes of the blocks the sequences hold.
  int64_t bytes_in_use() const;
  // Positions the sequences hold (at most one partly filled block each below the blocks').
  int64_t positions_in_use() const;

 private:
  struct Sequence {
    std::vector<int64_t> blocks;
    int64_t length = 0;
  };
  Sequence& sequence(int64_t seq);
  // Blocks enough for `length` positions (taking free ones).
  void grow(Sequence& s, int64_t length);
  // Returns all of s's blocks to the free stack.
  void give_back(Sequence& s);
  // Adds `seq` with blocks for `length` positions, filled by `fill`; if it throws, the blocks
  // go back and nothing is added.
  void add(int64_t seq, int64_t length, const std::function<void(const Sequence&)>& fill);
  // The slots of s's first `count` positions.
  std::vector<int64_t> slots(const Sequence& s, int64_t count) const;
  // Where position j of `s` lives: block · block_size + offset.
  int64_t slot(const Sequence& s, int64_t j) const {
    return s.blocks[size_t(j / pool_.block_size)] * pool_.block_size + j % pool_.block_size;
  }

  models::KvBlockPool pool_;
  std::vector<int64_t> free_;  // a stack: the last freed block is taken first
  std::unordered_map<int64_t, Sequence> sequences_;
};

}  // namespace mt::serve
