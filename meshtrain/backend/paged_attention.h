#pragma once
// Decode attention over a paged KV cache (the serving engine's KV memory):
// cpu/paged_attention.cpp and cuda/paged_attention.cu. The keys and the values of every
// sequence live in fixed-size blocks of one pool per layer, (blocks, Hkv, block_size, D), and a
// sequence's positions are found through its row of a block table. One call attends every row
// of a batch to its own positions, whatever their lengths, with no padding and no per-row arrays.
#include <cstdint>
#include <vector>

#include "meshtrain/core/array.h"

namespace mt::kernels {

// Row b of a batch: its first lengths[b] positions, position j in block
// block_table[b · max_blocks + j / block_size] at offset j % block_size.
struct PagedRows {
  std::vector<int64_t> block_table;  // (B, max_blocks)
  int64_t max_blocks = 0;
  std::vector<int64_t> lengths;      // (B,)
};

}  // namespace mt::kernels

// paged_kv_write: copies kv (B, Hkv, T, D) into `pool` (blocks, Hkv, block_size, D): kv[b, :, t]
//   goes to slot slots[b · T + t] = block · block_size + offset.
// paged_attention: out (B, H, 1, D) = softmax(scale · q kᵀ) v for each row b over its positions
//   (query head h reads key/value head h / (H / Hkv)); f32 arithmetic for every dtype.
#define MT_PAGED_ATTENTION_KERNELS                                                                   \
  void paged_kv_write(Array& pool, const Array& kv, const std::vector<int64_t>& slots);              \
  void paged_attention(const Array& q, const Array& k_pool, const Array& v_pool,                     \
                       const kernels::PagedRows& rows, float scale, Array& out);

namespace mt::cpu { MT_PAGED_ATTENTION_KERNELS }
namespace mt::cuda { MT_PAGED_ATTENTION_KERNELS }
