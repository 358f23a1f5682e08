#include "meshtrain/models/common.h"

#include <cmath>

#include "meshtrain/distributed/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

const char* param_kind_name(ParamKind kind) {
  switch (kind) {
    case ParamKind::embedding: return "embedding";
    case ParamKind::attention_qkv: return "attention_qkv";
    case ParamKind::attention_out: return "attention_out";
    case ParamKind::mlp_in: return "mlp_in";
    case ParamKind::mlp_out: return "mlp_out";
    case ParamKind::lm_head: return "lm_head";
    case ParamKind::position_bias: return "position_bias";
    case ParamKind::dense: return "dense";
    case ParamKind::norm: return "norm";
    case ParamKind::bias: return "bias";
    case ParamKind::lora_a: return "lora_a";
    case ParamKind::lora_b: return "lora_b";
    case ParamKind::other: return "other";
  }
  return "other";
}

ParamRole linear_role(ParamKind kind) { return {kind, 1, 0}; }
ParamRole conv1d_role(ParamKind kind) { return {kind, 0, 1}; }
ParamRole embedding_role() { return {ParamKind::embedding, 0, 1}; }
ParamRole vector_role(ParamKind kind) { return {kind, -1, -1}; }

uint64_t path_hash(const std::string& path) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : path) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

Params init_params(const std::vector<ParamDef>& defs, const RngKey& key, DType dtype) {
  Params p;
  for (const ParamDef& d : defs) {
    RngKey k = key.fold_in(path_hash(d.path));
    Array v;
    switch (d.init) {
      case InitKind::zeros: v = Array::zeros(d.shape, dtype); break;
      case InitKind::ones: v = Array::ones(d.shape, dtype); break;
      case InitKind::normal: v = random_normal(k, d.shape, dtype, 0.0, d.std); break;
      case InitKind::xavier_uniform: {
        // Glorot: U(-a, a) with a = sqrt(6 / (fan_in + fan_out)).
        MT_CHECK(d.shape.ndim() == 2, "[init] xavier_uniform needs a matrix, got ", d.shape.str(), " for ", d.path);
        double a = std::sqrt(6.0 / double(d.shape[0] + d.shape[1]));
        v = random_uniform(k, d.shape, dtype, -a, a);
        break;
      }
      case InitKind::kaiming_uniform: {
        MT_CHECK(d.shape.ndim() == 2, "[init] kaiming_uniform needs a matrix, got ", d.shape.str(), " for ", d.path);
        double a = 1.0 / std::sqrt(double(d.shape[1]));
        v = random_uniform(k, d.shape, dtype, -a, a);
        break;
      }
    }
    if (d.zero_row >= 0 && d.zero_row < d.shape[0]) {
      // Rebuild with the row zeroed (a host write: init is not traced).
      Array c = cast(v, DType::f32).to(Device::cpu()).clone();
      float* row = c.data<float>() + d.zero_row * d.shape[1];
      for (int64_t j = 0; j < d.shape[1]; ++j) row[j] = 0.0f;
      v = cast(c.to(v.device()), dtype);
    }
    p.set(d.path, v);
  }
  return p;
}

ParamRoles roles_of(const std::vector<ParamDef>& defs) {
  ParamRoles r;
  for (const ParamDef& d : defs) r[d.path] = d.role;
  return r;
}

void check_params(const std::vector<ParamDef>& defs, const Params& params, const char* model) {
  for (const ParamDef& d : defs) {
    MT_CHECK(params.contains(d.path), "[", model, "] missing parameter '", d.path, "' (expected shape ",
             d.shape.str(), ")");
    const Array& a = params[d.path];
    MT_CHECK(a.shape() == d.shape, "[", model, "] parameter '", d.path, "' has shape ", a.shape().str(),
             ", expected ", d.shape.str());
  }
}

Array linear(const Array& x, const Array& weight, const Array& bias) {
  Array y = matmul(x, weight, false, true);
  return bias.defined() ? add(y, bias) : y;
}

Array conv1d(const Array& x, const Array& weight, const Array& bias) {
  Array y = matmul(x, weight);
  return bias.defined() ? add(y, bias) : y;
}

void check_activation(const std::string& name, const char* what) {
  static const char* known[] = {"gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh"};
  for (const char* k : known)
    if (name == k) return;
  throw Error(detail::concat("[", what, "] unsupported activation '", name,
                             "' (supported: gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish, tanh)"));
}

Array activation(const Array& x, const std::string& name) {
  if (name == "gelu") return gelu(x, false);
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return gelu(x, true);
  if (name == "relu") return relu(x);
  if (name == "silu" || name == "swish") return silu(x);
  if (name == "tanh") return tanh(x);
  check_activation(name, "activation");
  return x;
}

Array split_heads(const Array& x, int64_t heads) {
  MT_CHECK(x.ndim() == 3 && x.dim(2) % heads == 0, "[split_heads] expects (B, T, H*D) with H = ", heads, ", got ",
           x.str());
  return swap_axes(reshape(x, {x.dim(0), x.dim(1), heads, x.dim(2) / heads}), 1, 2);
}

Array merge_heads(const Array& x) {
  MT_CHECK(x.ndim() == 4, "[merge_heads] expects (B, H, T, D), got ", x.str());
  return reshape(swap_axes(x, 1, 2), {x.dim(0), x.dim(2), x.dim(1) * x.dim(3)});
}

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

Array arange_ids(int64_t start, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + i;
  return Array::from_vector(v, Shape{n});
}

Array position_ids_from_mask(const Array& attention_mask, int64_t t) {
  MT_CHECK(attention_mask.ndim() == 2 && attention_mask.dim(1) >= t, "[position_ids] attention mask ",
           attention_mask.str(), " must be (B, P + T) with T = ", t);
  const int64_t b = attention_mask.dim(0), tk = attention_mask.dim(1);
  // A batch-sharded mask is gathered (every rank calls this alike), positions are replicated.
  std::vector<double> m = (attention_mask.sharded() ? dist::to_host(attention_mask) : attention_mask).to_doubles();
  std::vector<int64_t> pos(size_t(b * t));
  for (int64_t i = 0; i < b; ++i) {
    int64_t count = 0;
    for (int64_t j = 0; j < tk; ++j) {
      bool on = m[size_t(i * tk + j)] != 0;
      count += on;
      if (j >= tk - t) pos[size_t(i * t + j - (tk - t))] = on ? count - 1 : 1;
    }
  }
  return Array::from_vector(pos, Shape{b, t});
}

Array padding_mask(const Array& attention_mask, const char* what) {
  if (!attention_mask.defined()) return Array();
  MT_CHECK(attention_mask.ndim() == 2, "[", what, "] attention_mask must be (B, T), got ", attention_mask.str());
  Array on = attention_mask.dtype() == DType::boolean ? attention_mask
                                                      : ne(attention_mask, scalar_like(attention_mask, 0.0));
  return reshape(on, {attention_mask.dim(0), 1, 1, attention_mask.dim(1)});
}

ResolvedDecoderInputs resolve_decoder_inputs(const DecoderInputs& in, const KvCache* cache, int64_t max_positions,
                                             const char* what) {
  ResolvedDecoderInputs r;
  MT_CHECK(in.input_ids.defined() && in.input_ids.ndim() == 2 && is_integer(in.input_ids.dtype()), "[", what,
           "] input_ids must be integer (B, T), got ", in.input_ids.defined() ? in.input_ids.str() : "undefined");
  const int64_t b = in.input_ids.dim(0), t = in.input_ids.dim(1);
  MT_CHECK(t > 0, "[", what, "] input_ids ", in.input_ids.str(), " has no positions");
  r.ids = in.input_ids;
  if (cache && cache->paged) {
    // Each row continues its own sequence: positions come from the caller, padding never exists.
    const std::vector<int64_t>& lengths = cache->paged->rows.lengths;
    MT_CHECK(int64_t(lengths.size()) == b && t == 1, "[", what, "] a paged KV cache of ", lengths.size(),
             " rows decodes one position per row, got input_ids ", in.input_ids.str());
    MT_CHECK(!in.attention_mask.defined(), "[", what, "] a paged KV cache takes no attention_mask");
    const Array& p = in.position_ids;
    MT_CHECK(p.defined() && is_integer(p.dtype()) && p.ndim() == 2 && p.dim(0) == b && p.dim(1) == t, "[", what,
             "] a paged KV cache needs position_ids (B, 1) for input_ids ", in.input_ids.str());
    for (size_t i = 0; i < lengths.size(); ++i)
      MT_CHECK(max_positions <= 0 || lengths[i] <= max_positions, "[", what, "] row ", i, ": ", lengths[i],
               " positions exceed the model's maximum of ", max_positions);
    r.positions = p;
    return r;
  }
  r.past = cache ? cache->length() : 0;
  if (cache && r.past > 0)
    MT_CHECK(cache->batch() == b, "[", what, "] KV cache holds batch ", cache->batch(), " but input_ids is ",
             in.input_ids.str());
  if (in.attention_mask.defined()) {
    MT_CHECK(in.attention_mask.ndim() == 2 && in.attention_mask.dim(0) == b && in.attention_mask.dim(1) == r.past + t,
             "[", what, "] attention_mask ", in.attention_mask.str(), " must be (B, past + T) = (", b, ", ",
             r.past + t, ") for input_ids ", in.input_ids.str(), " and ", r.past, " cached positions");
    r.mask = padding_mask(in.attention_mask, what);
  }
  if (in.position_ids.defined()) {
    const Array& p = in.position_ids;
    MT_CHECK(is_integer(p.dtype()) && ((p.ndim() == 2 && p.dim(0) == b && p.dim(1) == t) || (p.ndim() == 1 && p.dim(0) == t)),
             "[", what, "] position_ids ", p.str(), " must be integer (B, T) or (T,) for input_ids ",
             in.input_ids.str());
    r.positions = p;
  } else if (in.attention_mask.defined()) {
    r.positions = position_ids_from_mask(in.attention_mask, t);
  } else {
    r.positions = arange_ids(r.past, t);
  }
  if (max_positions > 0)
    MT_CHECK(r.past + t <= max_positions, "[", what, "] ", r.past + t, " positions (", r.past, " cached + ", t,
             " new) exceed the model's maximum of ", max_positions);
  return r;
}

Array transformer_block(Remat remat, const Params& p, const std::string& prefix, const Array& x, const BlockFn& body) {
  if (remat == Remat::none) return body(p, x);
  return checkpoint([body](const Params& bp, const std::vector<Array>& xs) { return body(bp, xs[0]); },
                    p.with_prefix(prefix), {x});
}

Array transformer_block(Remat remat, const Params& p, const std::string& prefix, const std::vector<Array>& inputs,
                        const MultiInputBlockFn& body) {
  if (remat == Remat::none) return body(p, inputs);
  // Undefined inputs (no mask, no bias) stay out of the checkpoint's traced inputs.
  std::vector<Array> defined;
  std::vector<int> where;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined()) where.push_back(int(i)), defined.push_back(inputs[i]);
  const size_t n = inputs.size();
  return checkpoint(
      [body, where, n](const Params& bp, const std::vector<Array>& xs) {
        std::vector<Array> all(n);
        for (size_t i = 0; i < where.size(); ++i) all[size_t(where[i])] = xs[i];
        return body(bp, all);
      },
      p.with_prefix(prefix), defined);
}

}  // namespace mt::models
