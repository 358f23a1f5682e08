#pragma once
// LLaMA with Hugging Face's parameter names (LlamaForCausalLM):
//   model.embed_tokens.weight (V, C),
//   model.layers.N.input_layernorm.weight, model.layers.N.self_attn.{q,k,v,o}_proj.weight,
//   model.layers.N.post_attention_layernorm.weight, model.layers.N.mlp.{gate,up,down}_proj.weight,
//   model.norm.weight, lm_head.weight (V, C; absent when tie_word_embeddings).
// All projections are nn.Linear [out, in]. RMSNorm, rotary embeddings, SwiGLU, grouped-query
// attention (num_key_value_heads <= num_attention_heads).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/models/causal_lm.h"
#include "meshtrain/models/common.h"
#include "meshtrain/models/lora_options.h"

namespace mt::models {

struct LlamaConfig {
  LoraOptions lora{};  // adapters the parameters carry (lora.h); not part of config.json
  Remat remat = Remat::none;  // what training recomputes in backward (--remat); not part of config.json
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  // Rotary pairs: false = half-split (x_i, x_{i+D/2}) as HF checkpoints; true = interleaved
  // (x_2i, x_2i+1) as llama2.c checkpoints, whose q/k rows are not permuted. A meshtrain
  // key ("rotary_interleaved") in config.json.
  bool rope_interleaved = false;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // biases on q/k/v/o (absent in LLaMA proper)
  double attention_dropout = 0.0;
  std::string hidden_act = "silu";
  double initializer_range = 0.02;
  int64_t bos_token_id = 1, eos_token_id = 2;

  int64_t dim_per_head() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  // Required: vocab_size, hidden_size, intermediate_size, num_hidden_layers,
  // num_attention_heads; the rest default as in transformers' LlamaConfig.
  static LlamaConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  void validate() const;
};

std::vector<ParamDef> llama_param_defs(const LlamaConfig& c);
ParamRoles llama_param_roles(const LlamaConfig& c);
// HF init: normal(0, initializer_range) for every projection and embedding, ones for RMSNorm.
Params llama_init(const LlamaConfig& c, const RngKey& key, DType dtype = DType::f32);

// Final hidden states (B, T, C) after model.norm.
Array llama_hidden(const LlamaConfig& c, const Params& p, const DecoderInputs& in, const RngKey& dropout_key = {},
                   bool train = false, KvCache* cache = nullptr);
// lm_head (with its adapter) on hidden states, or the embedding when tied and p has no lm_head.
Array llama_head(const LlamaConfig& c, const Params& p, const Array& hidden, const RngKey& dropout_key = {},
                 bool train = false);
// The weight llama_head multiplies by when it is a plain product (no adapter or bias), else "".
std::string llama_plain_head_weight(const LlamaConfig& c, const Params& p);
// Logits (B, T, V) from lm_head (or the embedding when tied).
Array llama_apply(const LlamaConfig& c, const Params& p, const DecoderInputs& in, const RngKey& dropout_key = {},
                  bool train = false, KvCache* cache = nullptr);

// The model as generation sees it (causal_lm.h); the closure holds `c` and `p`'s handles.
CausalLm llama_causal_lm(const LlamaConfig& c, const Params& p);

}  // namespace mt::models
