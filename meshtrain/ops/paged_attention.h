#pragma once
// A paged KV cache, as serving engines keep one (vLLM's PagedAttention): per layer one pool
// of fixed-size blocks, (blocks, Hkv, block_size, D), shared by every sequence of a batch; a
// sequence owns a list of blocks (its row of a block table). Writing a step's keys costs the
// step's bytes, not a copy of the whole cache, and one primitive attends every row of a
// decode batch to its own positions, whatever their lengths. Decode only, no gradients: the
// training path keeps its ordinary (B, Hkv, T, D) arrays.
#include <cstdint>
#include <vector>

#include "meshtrain/backend/paged_attention.h"
#include "meshtrain/core/array.h"

namespace mt {

using kernels::PagedRows;

// An uninitialized pool (blocks, Hkv, block_size, D) for keys or values shaped as kv (B, Hkv,
// T, D): kv's dtype and device, its heads split as kv's are under tensor parallelism.
Array kv_pool_like(const Array& kv, int64_t blocks, int64_t block_size);

// Writes kv (B, Hkv, T, D) into `pool`: kv[b, :, t] at slot slots[b·T + t] (= block ·
// block_size + offset). In place — the result shares the pool's storage, and every handle
// on the pool sees the write — unless the pool must first be brought to another layout.
// Use as pool = paged_kv_write(pool, kv, slots).
Array paged_kv_write(const Array& pool, const Array& kv, const std::vector<int64_t>& slots);

// softmax(scale · q kᵀ) v of one query per row: q (B, H, 1, D); row b attends to its first
// rows.lengths[b] positions in the pools, found through its row of rows.block_table (query
// head h reads key/value head h / (H / Hkv): grouped-query attention). scale 0 = 1/sqrt(D).
Array paged_attention(const Array& q, const Array& k_pool, const Array& v_pool, const PagedRows& rows,
                      double scale = 0);

}  // namespace mt
