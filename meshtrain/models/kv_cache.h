#pragma once
// The decoders' KV cache: dense (keys and values per layer, appended each step; rows
// reordered for beam search) or paged over a block pool (continuous batching), and the
// attention of a step's queries over it.
#include <cstdint>
#include <utility>
#include <vector>

#include "meshtrain/core/array.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/paged_attention.h"

namespace mt::models {

// A paged KV cache's memory (continuous batching, meshtrain/serve): per layer one pool of
// `blocks` blocks of `block_size` positions, (blocks, Hkv, block_size, D) (ops/paged_attention.h),
// made at the first write. Which blocks belong to which sequence is the serving engine's
// business; a PagedKvStep tells one forward pass.
struct KvBlockPool {
  std::vector<Array> keys, values;
  int64_t blocks = 0, block_size = 16;
  // Bytes one block takes over all layers (0 before the first write).
  int64_t block_bytes() const;
  // Writes k and v (B, Hkv, T, D) of layer `layer` at `slots` (B·T, as paged_kv_write), making
  // the layer's pools at its first write.
  void write(size_t layer, const Array& k, const Array& v, const std::vector<int64_t>& slots);
};

// One decode step over a block pool: row i's new position goes to slots[i] (block ·
// block_size + offset), then row i attends to its first rows.lengths[i] positions.
struct PagedKvStep {
  KvBlockPool* pool = nullptr;
  std::vector<int64_t> slots;
  PagedRows rows;
};

// Keys and values of earlier positions, per layer: (B, Hkv, P, D) each.
//
// Paged mode (continuous batching): `paged` set makes a forward pass of one new token per row
// write into the block pool and attend through the rows' block tables instead (the shared
// arrays stay empty). The pass then takes position_ids (B, 1) and no attention_mask, and each
// row attends to its own positions only, as it would alone (no padding enters its softmax).
struct KvCache {
  std::vector<Array> keys, values;
  PagedKvStep* paged = nullptr;
  int64_t length() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].dim(2); }
  int64_t batch() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].dim(0); }
  // Bytes held by the keys and values.
  int64_t nbytes() const;
  // Appends this step's k, v (B, Hkv, T, D) to layer `layer` and returns the full k, v.
  std::pair<Array, Array> append(size_t layer, const Array& k, const Array& v);
  // Row i of the new cache is row rows[i] of the old one (beam search reordering).
  void select_rows(const std::vector<int64_t>& rows);
  void clear() { keys.clear(), values.clear(); }
};

// Attention of this step's q (B, H, T, D) over the cache extended with this step's k, v
// (which it appends), as scaled_dot_product_attention with `mask`; no cache: over k, v alone.
// A paged cache writes into its pool and attends with paged_attention.
Array cached_attention(KvCache* cache, size_t layer, const Array& q, const Array& k, const Array& v,
                       const Array& mask, const AttentionOptions& options);
// The same over a block's projections (B, T, H·D) and (B, T, Hkv·D), to (B, T, H·D): without a
// cache as projected_attention (models/layers.h: no head transposes), with one the heads split
// around cached_attention.
Array cached_projected_attention(KvCache* cache, size_t layer, const Array& q, const Array& k, const Array& v,
                                 int64_t heads, int64_t kv_heads, const Array& mask, const AttentionOptions& options);

// The same over one fused q | k | v projection (B, T, (H + 2·Hkv)·D): without a cache as
// packed_projected_attention, with one its three slices as cached_projected_attention.
Array cached_packed_projected_attention(KvCache* cache, size_t layer, const Array& qkv, int64_t heads,
                                        int64_t kv_heads, const Array& mask, const AttentionOptions& options);

}  // namespace mt::models
