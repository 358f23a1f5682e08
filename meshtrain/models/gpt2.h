#pragma once
// GPT-2 with Hugging Face's parameter names (GPT2LMHeadModel):
//   transformer.wte.weight (V, C), transformer.wpe.weight (P, C),
//   transformer.h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias},
//   transformer.ln_f.{weight, bias}.
// Conv1D weights are stored [in, out] (x @ W). The LM head is tied to wte: logits = x @ wteᵀ.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/models/causal_lm.h"
#include "meshtrain/models/common.h"
#include "meshtrain/models/lora_options.h"
#include "meshtrain/models/seq2seq.h"

namespace mt::models {

struct Gpt2Config {
  LoraOptions lora{};  // adapters the parameters carry (lora.h); not part of config.json
  Remat remat = Remat::none;  // what training recomputes in backward (--remat); not part of config.json
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;  // 0: 4 * n_embd
  std::string activation_function = "gelu_new";
  double resid_pdrop = 0.1, embd_pdrop = 0.1, attn_pdrop = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;
  // Cross-attention blocks (transformers' add_cross_attention: the decoder of a
  // VisionEncoderDecoderModel): per block ln_cross_attn, then crossattention.q_attn on the
  // states and crossattention.c_attn (keys | values) on DecoderInputs::encoder_hidden_states
  // (width n_embd), crossattention.c_proj; unmasked, scaled as the self-attention.
  bool add_cross_attention = false;
  int64_t bos_token_id = 50256, eos_token_id = 50256;

  int64_t inner() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  // Required: vocab_size, n_embd, n_layer, n_head (n_positions or n_ctx); the rest default
  // as in transformers' GPT2Config. Errors name the missing key.
  static Gpt2Config from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  void validate() const;
};

std::vector<ParamDef> gpt2_param_defs(const Gpt2Config& c);
ParamRoles gpt2_param_roles(const Gpt2Config& c);
// HF init: normal(0, initializer_range) for Conv1D and embeddings, zero biases, LayerNorm
// ones/zeros, and the residual projections (attn.c_proj, mlp.c_proj) at
// initializer_range / sqrt(2 n_layer).
Params gpt2_init(const Gpt2Config& c, const RngKey& key, DType dtype = DType::f32);

// Final hidden states (B, T, C) after ln_f. Dropout (embd, attention, residual) only in
// training; `cache` (optional) receives this call's keys and values.
// `cross`: with cross-attention, the generation cache (its `self` must be `cache`) that keeps
// each layer's keys and values of the encoder states, projected on the first step only.
Array gpt2_hidden(const Gpt2Config& c, const Params& p, const DecoderInputs& in, const RngKey& dropout_key = {},
                  bool train = false, KvCache* cache = nullptr, Seq2SeqCache* cross = nullptr);
// The tied LM head on hidden states: hidden @ wteᵀ.
Array gpt2_head(const Gpt2Config& c, const Params& p, const Array& hidden);
// Logits (B, T, V) of the tied LM head.
Array gpt2_apply(const Gpt2Config& c, const Params& p, const DecoderInputs& in, const RngKey& dropout_key = {},
                 bool train = false, KvCache* cache = nullptr);

// The model as generation sees it (causal_lm.h); the closure holds `c` and `p`'s handles.
CausalLm gpt2_causal_lm(const Gpt2Config& c, const Params& p);

}  // namespace mt::models
