#include "meshtrain/models/kv_cache.h"

#include <cmath>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/models/layers.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

std::pair<Array, Array> KvCache::append(size_t layer, const Array& k, const Array& v) {
  if (keys.size() <= layer) {
    keys.resize(layer + 1);
    values.resize(layer + 1);
  }
  if (keys[layer].defined()) {
    MT_CHECK(keys[layer].dim(0) == k.dim(0) && keys[layer].dim(1) == k.dim(1) && keys[layer].dim(3) == k.dim(3),
             "[kv_cache] layer ", layer, " holds ", keys[layer].str(), ", cannot append ", k.str());
    keys[layer] = concatenate({keys[layer], k}, 2);
    values[layer] = concatenate({values[layer], v}, 2);
  } else {
    keys[layer] = k;
    values[layer] = v;
  }
  return {keys[layer], values[layer]};
}

int64_t KvCache::nbytes() const {
  int64_t n = 0;
  for (size_t l = 0; l < keys.size(); ++l)
    if (keys[l].defined()) n += keys[l].nbytes() + values[l].nbytes();
  return n;
}

Array cached_attention(KvCache* cache, size_t layer, const Array& q, const Array& k, const Array& v,
                       const Array& mask, const AttentionOptions& options) {
  if (!cache) return scaled_dot_product_attention(q, k, v, mask, options);
  if (!cache->paged) {
    auto [keys, values] = cache->append(layer, k, v);
    return scaled_dot_product_attention(q, keys, values, mask, options);
  }
  MT_CHECK(!mask.defined() && !options.bias.defined() && q.dim(2) == 1, "[kv_cache] a paged KV cache decodes one "
           "position per row without a mask or a bias, got queries ", q.str());
  PagedKvStep& step = *cache->paged;
  KvBlockPool& pool = *step.pool;
  pool.write(layer, k, v, step.slots);
  return paged_attention(q, pool.keys[layer], pool.values[layer], step.rows, options.scale);
}

Array cached_projected_attention(KvCache* cache, size_t layer, const Array& q, const Array& k, const Array& v,
                                 int64_t heads, int64_t kv_heads, const Array& mask, const AttentionOptions& options) {
  if (!cache) return projected_attention(q, k, v, heads, kv_heads, mask, options);
  return merge_heads(cached_attention(cache, layer, split_heads(q, heads), split_heads(k, kv_heads),
                                      split_heads(v, kv_heads), mask, options));
}

Array cached_packed_projected_attention(KvCache* cache, size_t layer, const Array& qkv, int64_t heads,
                                        int64_t kv_heads, const Array& mask, const AttentionOptions& options) {
  if (!cache) return packed_projected_attention(qkv, heads, kv_heads, mask, options);
  const auto [q, k, v] = split_packed_projection(qkv, heads, kv_heads);
  return cached_projected_attention(cache, layer, q, k, v, heads, kv_heads, mask, options);
}

void KvBlockPool::write(size_t layer, const Array& k, const Array& v, const std::vector<int64_t>& slots) {
  if (keys.size() <= layer) {
    keys.resize(layer + 1);
    values.resize(layer + 1);
  }
  if (!keys[layer].defined()) {
    keys[layer] = kv_pool_like(k, blocks, block_size);
    values[layer] = kv_pool_like(v, blocks, block_size);
  }
  keys[layer] = paged_kv_write(keys[layer], k, slots);
  values[layer] = paged_kv_write(values[layer], v, slots);
}

int64_t KvBlockPool::block_bytes() const {
  int64_t n = 0;
  for (size_t l = 0; l < keys.size(); ++l)
    if (keys[l].defined()) n += (keys[l].nbytes() + values[l].nbytes()) / keys[l].dim(0);
  return n;
}

void KvCache::select_rows(const std::vector<int64_t>& rows) {
  Array idx = Array::from_vector(rows, Shape{int64_t(rows.size())});
  for (size_t l = 0; l < keys.size(); ++l) {
    if (!keys[l].defined()) continue;
    keys[l] = take(keys[l], idx, 0);
    values[l] = take(values[l], idx, 0);
  }
}

}  // namespace mt::models
