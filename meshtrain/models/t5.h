#pragma once
// T5 with Hugging Face's parameter names (T5ForConditionalGeneration):
//   shared.weight (V, C);
//   encoder.block.N.layer.0.SelfAttention.{q,k,v,o}.weight, .layer.0.layer_norm.weight,
//   encoder.block.N.layer.1.DenseReluDense.{wi | wi_0, wi_1, wo}.weight, .layer.1.layer_norm.weight,
//   encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight (buckets, H),
//   encoder.final_layer_norm.weight; the decoder the same with layer.1.EncDecAttention and
//   the MLP in layer.2; lm_head.weight (V, C) when the embeddings are not tied.
// v1.0 (t5-small): ReLU MLP, head tied to `shared` with hidden states scaled by C^-0.5.
// v1.1 / Flan: gated-GELU MLP (feed_forward_proj "gated-gelu"), untied head.
// Norms are T5's RMS-style LayerNorm (no mean, no bias); attention scores are not scaled;
// the relative position bias is computed once from block 0's table and shared by all
// layers (bidirectional buckets in the encoder, causal in the decoder).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/models/common.h"
#include "meshtrain/models/lora_options.h"
#include "meshtrain/models/seq2seq.h"

namespace mt::models {

struct T5Config {
  LoraOptions lora{};         // adapters the parameters carry (lora.h); not part of config.json
  Remat remat = Remat::none;  // what training recomputes in backward (--remat); not part of config.json
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_decoder_layers = 6;
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double dropout_rate = 0.1;
  double layer_norm_epsilon = 1e-6;
  double initializer_factor = 1.0;
  std::string feed_forward_proj = "relu";  // "relu", "gated-gelu", "gated-silu", ...
  bool tie_word_embeddings = true;
  int64_t pad_token_id = 0, eos_token_id = 1, decoder_start_token_id = 0;

  // feed_forward_proj "gated-<act>" or "<act>"; gated-gelu means the tanh GELU (gelu_new).
  bool gated() const;
  std::string activation() const;
  int64_t inner() const { return num_heads * d_kv; }
  // Required: vocab_size, d_model, d_kv, d_ff, num_layers, num_heads; the rest default as in
  // transformers' T5Config (num_decoder_layers = num_layers).
  static T5Config from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  void validate() const;
};

std::vector<ParamDef> t5_param_defs(const T5Config& c);

// T5's relative position buckets (T5Attention._relative_position_bucket) of key position
// minus query position, computed in f32 as Hugging Face does.
int64_t t5_relative_position_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets,
                                    int64_t max_distance);
// The additive score bias (1, H, Tq, Tk) of queries at positions q_start.. against keys
// 0..Tk-1 from the bias table `table` (buckets, H).
Array t5_position_bias(const T5Config& c, const Array& table, int64_t q_start, int64_t tq, int64_t tk,
                       bool bidirectional);

// Encoder output after the final norm (dropout in training).
EncoderOutput t5_encode(const T5Config& c, const Params& p, const Array& input_ids, const Array& attention_mask,
                        const RngKey& dropout_key = {}, bool train = false);
// Decoder hidden states (B, T, C) after the final norm; `cache` (optional) receives this
// call's keys/values and the cross-attention projections.
Array t5_decode_hidden(const T5Config& c, const Params& p, const Array& decoder_ids, const EncoderOutput& enc,
                       const Array& decoder_attention_mask = {}, const RngKey& dropout_key = {}, bool train = false,
                       Seq2SeqCache* cache = nullptr);
// The LM head: tied (hidden · C^-0.5 @ sharedᵀ) or lm_head.
Array t5_head(const T5Config& c, const Params& p, const Array& hidden, const RngKey& dropout_key = {},
              bool train = false);
// Teacher-forced logits (B, T, V).
Array t5_apply(const T5Config& c, const Params& p, const Seq2SeqInputs& in, const RngKey& dropout_key = {},
               bool train = false);
Seq2SeqLm t5_seq2seq_lm(const T5Config& c, const Params& p);

}  // namespace mt::models
