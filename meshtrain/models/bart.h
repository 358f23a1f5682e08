#pragma once
// BART with Hugging Face's parameter names (BartForConditionalGeneration):
//   model.shared.weight (V, C); model.{encoder,decoder}.embed_positions.weight (P + 2, C)
//   (learned positions with BART's offset of 2); model.{encoder,decoder}.layernorm_embedding;
//   model.encoder.layers.N.{self_attn.{q,k,v,out}_proj, self_attn_layer_norm, fc1, fc2,
//   final_layer_norm}; the decoder's layers add encoder_attn.* and encoder_attn_layer_norm;
//   final_logits_bias (1, V); the head is tied to model.shared.
// Post-LN blocks (the norm after each residual), embeddings scaled by sqrt(C) when
// scale_embedding, attention scaled by head_dim^-0.5.
//
// final_logits_bias is a buffer in transformers (saved, never trained): it is a parameter
// here so checkpoints round-trip, and the spec lists it in `buffers` so training freezes it.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/models/common.h"
#include "meshtrain/models/lora_options.h"
#include "meshtrain/models/seq2seq.h"

namespace mt::models {

struct BartConfig {
  LoraOptions lora{};         // adapters the parameters carry (lora.h); not part of config.json
  Remat remat = Remat::none;  // what training recomputes in backward (--remat); not part of config.json
  int64_t vocab_size = 50265;
  int64_t max_position_embeddings = 1024;
  int64_t d_model = 1024;
  int64_t encoder_layers = 12, decoder_layers = 12;
  int64_t encoder_ffn_dim = 4096, decoder_ffn_dim = 4096;
  int64_t encoder_attention_heads = 16, decoder_attention_heads = 16;
  std::string activation_function = "gelu";
  double dropout = 0.1, attention_dropout = 0.0, activation_dropout = 0.0;
  double init_std = 0.02;
  bool scale_embedding = false;
  bool tie_word_embeddings = true;
  int64_t pad_token_id = 1, bos_token_id = 0, eos_token_id = 2, decoder_start_token_id = 2;
  std::optional<int64_t> forced_bos_token_id{}, forced_eos_token_id = int64_t(2);

  double embed_scale() const;
  // Required: vocab_size, d_model, encoder_layers, decoder_layers, encoder_attention_heads,
  // decoder_attention_heads, encoder_ffn_dim, decoder_ffn_dim; the rest default as in
  // transformers' BartConfig.
  static BartConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  void validate() const;
};

std::vector<ParamDef> bart_param_defs(const BartConfig& c);

EncoderOutput bart_encode(const BartConfig& c, const Params& p, const Array& input_ids, const Array& attention_mask,
                          const RngKey& dropout_key = {}, bool train = false);
// Decoder hidden states (B, T, C) after the last layer; `cache` (optional) receives this
// call's keys/values and the cross-attention projections.
Array bart_decode_hidden(const BartConfig& c, const Params& p, const Array& decoder_ids, const EncoderOutput& enc,
                         const Array& decoder_attention_mask = {}, const RngKey& dropout_key = {}, bool train = false,
                         Seq2SeqCache* cache = nullptr);
// hidden @ sharedᵀ (or lm_head when untied) + final_logits_bias.
Array bart_head(const BartConfig& c, const Params& p, const Array& hidden, const RngKey& dropout_key = {},
                bool train = false);
Array bart_apply(const BartConfig& c, const Params& p, const Seq2SeqInputs& in, const RngKey& dropout_key = {},
                 bool train = false);
Seq2SeqLm bart_seq2seq_lm(const BartConfig& c, const Params& p);

}  // namespace mt::models
