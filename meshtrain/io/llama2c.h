#pragma once
// llama2.c's legacy ("v0") checkpoint: 7 int32 {dim, hidden_dim, n_layers, n_heads,
// n_kv_heads, vocab_size (negative = unshared classifier), seq_len}, then f32 weights:
// token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3 (each stacked over layers),
// rms_final, freq_cis_real, freq_cis_imag (seq_len x head_dim/2 each), [wcls].
#include <nlohmann/json.hpp>
#include <string>

#include "meshtrain/autodiff/params.h"

namespace mt::io {

struct Llama2cConfig {
  int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  bool shared_classifier;
  // llama2.c rotates interleaved pairs (x[2i], x[2i+1]); HF LLaMA rotates half-split pairs.
  // The weights are kept as stored, so the model must use the interleaved convention.
  bool rotary_interleaved = true;
  float rope_theta = 10000.0f;  // run.c / model.py
  float norm_eps = 1e-5f;       // run.c's rmsnorm
  int head_dim() const { return dim / n_heads; }
};

struct Llama2cCheckpoint {
  Llama2cConfig config;
  // HF LLaMA names: model.embed_tokens.weight; model.layers.{i}.{input_layernorm,
  // post_attention_layernorm}.weight, .self_attn.{q,k,v,o}_proj.weight ([out, in]),
  // .mlp.{gate,up,down}_proj.weight (w1, w3, w2); model.norm.weight; lm_head.weight (the
  // same Array as the embedding when shared). Arrays alias the file mapping (no copy).
  Params params;
  Array freq_cis_real, freq_cis_imag;  // (seq_len, head_dim / 2) as stored in the file
};

// Validates the header and that the file length is exactly what it implies; errors are
// "[llama2c] <path>: ...".
Llama2cCheckpoint load_llama2c(const std::string& path);

// The exact file size (bytes) a legacy checkpoint with this header has.
uint64_t llama2c_file_size(const Llama2cConfig& config);

// Writes a legacy v0 file (atomically) from params under the names above; freq_cis is
// recomputed from rope_theta. lm_head.weight is written only when !shared_classifier.
void save_llama2c(const std::string& path, const Llama2cConfig& config, const Params& params);

// A Hugging Face LlamaConfig-style config.json for this checkpoint, with the extra key
// "rotary_interleaved": true.
nlohmann::json llama2c_hf_config(const Llama2cConfig& config);

}  // namespace mt::io
