#pragma once
// Pieces shared by the models: the parameter table each model declares (shape, initializer,
// sharding role), config.json accessors whose errors name the missing key, dense layers in
// both storage conventions, attention masks, position ids and the KV cache.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/autodiff/remat.h"
#include "meshtrain/core/array.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/models/param_roles.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/paged_attention.h"

namespace mt::models {

// ---------------------------------------------------------------- parameter tables

// kaiming_uniform: torch's kaiming_uniform_(a = sqrt(5)) on a [out, in] matrix, i.e.
// U(-1/sqrt(in), 1/sqrt(in)) — nn.Linear's default and PEFT's init of LoRA's A.
enum class InitKind { normal, zeros, ones, xavier_uniform, kaiming_uniform };

// One parameter of a model: its Hugging Face path, shape, random init and sharding role.
struct ParamDef {
  std::string path;
  Shape shape;
  ParamRole role;
  InitKind init = InitKind::normal;
  double std = 0.02;             // for InitKind::normal
  int64_t zero_row = -1;         // an embedding's padding row, zeroed after init (HF padding_idx)
  // The shape in Hugging Face files when the model keeps the same row-major data in another
  // shape (GPT-2's c_attn [in, 3*out] kept as [in, 3, out] so q, k and v split over heads
  // separately); loading reshapes from it, save_pretrained back to it.
  std::optional<Shape> file_shape{};
};

// Linear [out, in], Conv1D [in, out], embedding [rows, features], 1-d vectors.
ParamRole linear_role(ParamKind kind);
ParamRole conv1d_role(ParamKind kind);
ParamRole embedding_role();
ParamRole vector_role(ParamKind kind);  // norm / bias

// Initial values for every def: parameter `path` draws from key.fold_in(hash(path)), so a
// parameter's initial value does not depend on which other parameters exist.
Params init_params(const std::vector<ParamDef>& defs, const RngKey& key, DType dtype = DType::f32);
ParamRoles roles_of(const std::vector<ParamDef>& defs);
// Throws mt::Error naming `model`, the path and both shapes when a parameter is missing or
// has another shape than its def.
void check_params(const std::vector<ParamDef>& defs, const Params& params, const char* model);
uint64_t path_hash(const std::string& path);  // FNV-1a, stable across runs and platforms

// ---------------------------------------------------------------- config.json

// Reads config key `key`; a missing or mistyped key throws mt::Error naming `what`
// ("gpt2 config") and the key.
template <class T>
T config_get(const nlohmann::json& j, const char* key, const char* what) {
  MT_CHECK(j.is_object(), "[", what, "] config must be a JSON object");
  auto it = j.find(key);
  MT_CHECK(it != j.end() && !it->is_null(), "[", what, "] missing key '", key, "' in config.json");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::concat("[", what, "] key '", key, "' has the wrong type (", it->type_name(), "): ", e.what()));
  }
}
// The same with a default for absent or null keys (HF's config defaults).
template <class T>
T config_get(const nlohmann::json& j, const char* key, const char* what, const T& fallback) {
  MT_CHECK(j.is_object(), "[", what, "] config must be a JSON object");
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return config_get<T>(j, key, what);
}

// ---------------------------------------------------------------- layers

// nn.Linear: x @ weightᵀ + bias with weight [out, in]; bias may be undefined.
Array linear(const Array& x, const Array& weight, const Array& bias = Array());
// HF Conv1D: x @ weight + bias with weight [in, out].
Array conv1d(const Array& x, const Array& weight, const Array& bias);
// Hugging Face activation names: gelu (erf), gelu_new / gelu_pytorch_tanh (tanh), relu,
// silu / swish, tanh.
Array activation(const Array& x, const std::string& name);
void check_activation(const std::string& name, const char* what);
// (B, T, H*D) -> (B, H, T, D) and back.
Array split_heads(const Array& x, int64_t heads);
Array merge_heads(const Array& x);

// ---------------------------------------------------------------- decoder inputs

// Inputs of a decoder forward pass. With a KV cache holding P earlier positions:
//   input_ids      (B, T) integers: the new tokens;
//   attention_mask (B, P + T) 1 = token, 0 = padding (left-padded batches); undefined = all;
//   position_ids   (B, T) or (T,); undefined = from the mask (cumsum - 1, padding at 1, as
//                  HF generate) or P + arange(T) without a mask.
struct DecoderInputs {
  Array input_ids{};
  Array attention_mask{};
  Array position_ids{};
};

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

// i64 (n,) = start, start + 1, ...
Array arange_ids(int64_t start, int64_t n);
// Positions (B, T) of the last T of the mask's columns: cumsum(mask) - 1, 1 at padding.
Array position_ids_from_mask(const Array& attention_mask, int64_t t);
// Bool (B, 1, 1, Tk) "attend" mask from an integer/bool/float (B, Tk) 0/1 attention mask;
// undefined in, undefined out.
Array padding_mask(const Array& attention_mask, const char* what);
// Validates decoder inputs against the cache and fills the position ids.
struct ResolvedDecoderInputs {
  Array ids;        // (B, T)
  Array positions;  // (B, T) or (T,)
  Array mask;       // bool (B, 1, 1, P + T) or undefined
  int64_t past = 0;
};
ResolvedDecoderInputs resolve_decoder_inputs(const DecoderInputs& in, const KvCache* cache, int64_t max_positions,
                                             const char* what);

// One transformer block, x -> body(bp, x), where bp holds the parameters whose paths start
// with `prefix` (the block's weights and their adapters). With remat != none the block keeps
// only x for the backward pass and is rerun there (mt::checkpoint), so body must read its
// weights from bp, not from the whole tree.
using BlockFn = std::function<Array(const Params& bp, const Array& x)>;
Array transformer_block(Remat remat, const Params& p, const std::string& prefix, const Array& x, const BlockFn& body);
// The same for a block that reads more traced arrays than its input (an encoder's output for
// cross-attention, a position bias computed from parameters outside the block): all of them
// come in through `inputs`, inputs[0] being the residual stream.
using MultiInputBlockFn = std::function<Array(const Params& bp, const std::vector<Array>& inputs)>;
Array transformer_block(Remat remat, const Params& p, const std::string& prefix, const std::vector<Array>& inputs,
                        const MultiInputBlockFn& body);

}  // namespace mt::models
