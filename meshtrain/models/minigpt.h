#pragma once
// miniGPT, the seed tutorial's model (the JAX "train a miniGPT" tutorial): token + position
// embeddings, post-LayerNorm blocks
//   x = LN1(x + dropout(attn(x)));  x = LN2(x + dropout(W2 relu(W1 x)))
// with causal multi-head attention, and an untied output layer without bias.
// Parameter names (stable; every matrix is nn.Linear-style [out, in]):
//   embedding.token_emb.weight (V, C), embedding.pos_emb.weight (maxlen, C),
//   blocks.N.attn.{query,key,value,out}.{weight,bias}, blocks.N.ln1.{weight,bias},
//   blocks.N.ffn.linear1.{weight,bias} (ff, C), blocks.N.ffn.linear2.{weight,bias} (C, ff),
//   blocks.N.ln2.{weight,bias}, output_layer.weight (V, C).
// config.json: model_type "minigpt" and the field names below.
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/models/causal_lm.h"
#include "meshtrain/models/common.h"
#include "meshtrain/models/lora_options.h"

namespace mt::models {

struct MiniGptConfig {
  LoraOptions lora{};  // adapters the parameters carry (lora.h); not part of config.json
  Remat remat = Remat::none;  // what training recomputes in backward (--remat); not part of config.json
  int64_t vocab_size = 50257;
  int64_t maxlen = 256;
  int64_t embed_dim = 256;
  int64_t num_heads = 8;
  int64_t feed_forward_dim = 256;
  int64_t num_transformer_blocks = 8;
  double dropout_rate = 0.1;
  double layer_norm_epsilon = 1e-6;  // flax nnx.LayerNorm(epsilon=1e-6) in the tutorial

  // Every key is optional (defaults above are the tutorial's configuration).
  static MiniGptConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  void validate() const;
};

std::vector<ParamDef> minigpt_param_defs(const MiniGptConfig& c);
ParamRoles minigpt_param_roles(const MiniGptConfig& c);
// The tutorial's initializers: Xavier-uniform kernels, zero biases, LayerNorm ones/zeros,
// embeddings normal(0, 1/sqrt(embed_dim)) (flax nnx.Embed's default).
Params minigpt_init(const MiniGptConfig& c, const RngKey& key, DType dtype = DType::f32);

// Hidden states (B, T, C) after the last block. Dropout after attention and after the
// feed-forward, in training only.
Array minigpt_hidden(const MiniGptConfig& c, const Params& p, const DecoderInputs& in, const RngKey& dropout_key = {},
                     bool train = false, KvCache* cache = nullptr);
// output_layer (with its adapter) on hidden states.
Array minigpt_head(const MiniGptConfig& c, const Params& p, const Array& hidden, const RngKey& dropout_key = {},
                   bool train = false);
// Logits (B, T, V).
Array minigpt_apply(const MiniGptConfig& c, const Params& p, const DecoderInputs& in, const RngKey& dropout_key = {},
                    bool train = false, KvCache* cache = nullptr);

// The model as generation sees it (causal_lm.h); the closure holds `c` and `p`'s handles.
CausalLm minigpt_causal_lm(const MiniGptConfig& c, const Params& p);

}  // namespace mt::models
