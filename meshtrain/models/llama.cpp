#include "meshtrain/models/llama.h"

#include "meshtrain/models/lora.h"
#include "meshtrain/models/model_spec.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/rotary.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/fused_ops.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/nn_ops.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

LlamaConfig LlamaConfig::from_json(const nlohmann::json& j) {
  const char* w = "llama config";
  LlamaConfig c;
  c.vocab_size = config_get<int64_t>(j, "vocab_size", w);
  c.hidden_size = config_get<int64_t>(j, "hidden_size", w);
  c.intermediate_size = config_get<int64_t>(j, "intermediate_size", w);
  c.num_hidden_layers = config_get<int64_t>(j, "num_hidden_layers", w);
  c.num_attention_heads = config_get<int64_t>(j, "num_attention_heads", w);
  c.num_key_value_heads = config_get<int64_t>(j, "num_key_value_heads", w, c.num_attention_heads);
  c.head_dim = config_get<int64_t>(j, "head_dim", w, 0);
  c.max_position_embeddings = config_get<int64_t>(j, "max_position_embeddings", w, 2048);
  c.rms_norm_eps = config_get<double>(j, "rms_norm_eps", w, 1e-6);
  c.rope_theta = config_get<double>(j, "rope_theta", w, 10000.0);
  MT_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(), "[", w,
           "] rope_scaling is not supported (got ", j.contains("rope_scaling") ? j["rope_scaling"].dump() : "", ")");
  // meshtrain's key (io::llama2c_hf_config writes it); "rope_interleaved" is accepted too.
  c.rope_interleaved = config_get<bool>(j, "rotary_interleaved", w, config_get<bool>(j, "rope_interleaved", w, false));
  c.tie_word_embeddings = config_get<bool>(j, "tie_word_embeddings", w, false);
  c.attention_bias = config_get<bool>(j, "attention_bias", w, false);
  c.attention_dropout = config_get<double>(j, "attention_dropout", w, 0.0);
  c.hidden_act = config_get<std::string>(j, "hidden_act", w, "silu");
  c.initializer_range = config_get<double>(j, "initializer_range", w, 0.02);
  c.bos_token_id = config_get<int64_t>(j, "bos_token_id", w, 1);
  c.eos_token_id = config_get<int64_t>(j, "eos_token_id", w, 2);
  c.validate();
  return c;
}

nlohmann::json LlamaConfig::to_json() const {
  // architectures: the class transformers' from_pretrained and pipelines instantiate.
  return {{"model_type", "llama"},
          {"architectures", {"LlamaForCausalLM"}},
          {"vocab_size", vocab_size},
          {"hidden_size", hidden_size},
          {"intermediate_size", intermediate_size},
          {"num_hidden_layers", num_hidden_layers},
          {"num_attention_heads", num_attention_heads},
          {"num_key_value_heads", num_key_value_heads},
          {"head_dim", dim_per_head()},
          {"max_position_embeddings", max_position_embeddings},
          {"rms_norm_eps", rms_norm_eps},
          {"rope_theta", rope_theta},
          {"rotary_interleaved", rope_interleaved},
          {"tie_word_embeddings", tie_word_embeddings},
          {"attention_bias", attention_bias},
          {"attention_dropout", attention_dropout},
          {"hidden_act", hidden_act},
          {"initializer_range", initializer_range},
          {"bos_token_id", bos_token_id},
          {"eos_token_id", eos_token_id}};
}

void LlamaConfig::validate() const {
  MT_CHECK(vocab_size > 0 && hidden_size > 0 && intermediate_size > 0 && num_hidden_layers > 0 &&
               num_attention_heads > 0 && num_key_value_heads > 0,
           "[llama config] sizes must be positive: vocab_size ", vocab_size, ", hidden_size ", hidden_size,
           ", intermediate_size ", intermediate_size, ", num_hidden_layers ", num_hidden_layers,
           ", num_attention_heads ", num_attention_heads, ", num_key_value_heads ", num_key_value_heads);
  MT_CHECK(num_attention_heads % num_key_value_heads == 0, "[llama config] num_attention_heads ", num_attention_heads,
           " is not a multiple of num_key_value_heads ", num_key_value_heads);
  MT_CHECK(head_dim > 0 || hidden_size % num_attention_heads == 0, "[llama config] hidden_size ", hidden_size,
           " is not a multiple of num_attention_heads ", num_attention_heads);
  MT_CHECK(dim_per_head() % 2 == 0, "[llama config] head dim ", dim_per_head(), " must be even for rotary embeddings");
  check_activation(hidden_act, "llama config");
}

std::vector<ParamDef> llama_param_defs(const LlamaConfig& c) {
  c.validate();
  const int64_t e = c.hidden_size, f = c.intermediate_size, hd = c.dim_per_head();
  const int64_t qdim = c.num_attention_heads * hd, kvdim = c.num_key_value_heads * hd;
  const double std = c.initializer_range;
  std::vector<ParamDef> d;
  d.push_back({"model.embed_tokens.weight", {c.vocab_size, e}, embedding_role(), InitKind::normal, std});
  auto lin = [&](const std::string& p, int64_t out, int64_t in, ParamKind kind, bool bias) {
    d.push_back({p + ".weight", {out, in}, linear_role(kind), InitKind::normal, std});
    if (bias) d.push_back({p + ".bias", {out}, vector_role(ParamKind::bias), InitKind::zeros});
  };
  auto norm = [&](const std::string& p) {
    d.push_back({p + ".weight", {e}, vector_role(ParamKind::norm), InitKind::ones});
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string b = "model.layers." + std::to_string(l) + ".";
    norm(b + "input_layernorm");
    lin(b + "self_attn.q_proj", qdim, e, ParamKind::attention_qkv, c.attention_bias);
    lin(b + "self_attn.k_proj", kvdim, e, ParamKind::attention_qkv, c.attention_bias);
    lin(b + "self_attn.v_proj", kvdim, e, ParamKind::attention_qkv, c.attention_bias);
    lin(b + "self_attn.o_proj", e, qdim, ParamKind::attention_out, c.attention_bias);
    norm(b + "post_attention_layernorm");
    lin(b + "mlp.gate_proj", f, e, ParamKind::mlp_in, false);
    lin(b + "mlp.up_proj", f, e, ParamKind::mlp_in, false);
    lin(b + "mlp.down_proj", e, f, ParamKind::mlp_out, false);
  }
  norm("model.norm");
  if (!c.tie_word_embeddings) lin("lm_head", c.vocab_size, e, ParamKind::lm_head, false);
  return d;
}

ParamRoles llama_param_roles(const LlamaConfig& c) { return roles_of(llama_param_defs(c)); }

Params llama_init(const LlamaConfig& c, const RngKey& key, DType dtype) {
  return init_params(llama_param_defs(c), key, dtype);
}

Array llama_hidden(const LlamaConfig& c, const Params& p, const DecoderInputs& in, const RngKey& dropout_key,
                   bool train, KvCache* cache) {
  c.validate();
  // Rotary positions have no table to run off, so there is no hard position limit here.
  ResolvedDecoderInputs r = resolve_decoder_inputs(in, cache, 0, "llama");
  const int64_t hd = c.dim_per_head();
  const AdapterContext ac{c.lora, dropout_key.fold_in(path_hash("lora")), train};
  Array x = embedding(p["model.embed_tokens.weight"], r.ids);
  const Array mask = r.mask, positions = r.positions;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    const RngKey lk = dropout_key.fold_in(uint64_t(l));
    // Captures by value: a checkpointed block reruns in the backward pass, after this returns.
    auto block = [c, b, lk, mask, positions, ac, hd, train, cache, l](const Params& p, Array x) {
      auto dense = [&](const Array& h, const std::string& module, bool bias) {
        return adapted_linear(h, p, module, bias && c.attention_bias ? p[module + ".bias"] : Array(), ac);
      };
      Array h = rms_norm(x, p[b + "input_layernorm.weight"], c.rms_norm_eps);
      // Without a KV cache the heads stay inner, (B, T, H, D), from the projections through
      // the rotary embedding and the attention kernels: no head transposes (layers.h).
      const bool heads_inner = !cache && fused_layers();
      auto proj = [&](const char* n, int64_t heads) {
        const Array y = dense(h, b + "self_attn." + n, true);
        MT_CHECK(y.dim(2) == heads * hd, "[llama] ", n, " gives ", y.dim(2), " features, config says ", heads, " x ",
                 hd);
        return heads_inner ? reshape(y, {y.dim(0), y.dim(1), heads, hd}) : split_heads(y, heads);
      };
      Array q = proj("q_proj", c.num_attention_heads);
      Array k = proj("k_proj", c.num_key_value_heads), v = proj("v_proj", c.num_key_value_heads);
      q = rotary_embedding(q, positions, c.rope_theta, c.rope_interleaved, heads_inner);
      k = rotary_embedding(k, positions, c.rope_theta, c.rope_interleaved, heads_inner);
      AttentionOptions opt{.causal = true, .scale = 0, .dropout_rate = c.attention_dropout, .dropout_key = lk,
                           .train = train};
      Array a;
      if (heads_inner) {
        a = attention_heads_inner(q, k, v, mask, opt);
        a = reshape(a, {a.dim(0), a.dim(1), a.dim(2) * a.dim(3)});
      } else {
        a = merge_heads(cached_attention(cache, size_t(l), q, k, v, mask, opt));
      }
      x = add(x, dense(a, b + "self_attn.o_proj", true));
      h = rms_norm(x, p[b + "post_attention_layernorm.weight"], c.rms_norm_eps);
      Array g = activation(dense(h, b + "mlp.gate_proj", false), c.hidden_act);
      Array u = dense(h, b + "mlp.up_proj", false);
      return add(x, dense(mul(g, u), b + "mlp.down_proj", false));
    };
    x = transformer_block(c.remat, p, b, x, block);
  }
  return rms_norm(x, p["model.norm.weight"], c.rms_norm_eps);
}

Array llama_apply(const LlamaConfig& c, const Params& p, const DecoderInputs& in, const RngKey& dropout_key, bool train,
                  KvCache* cache) {
  return llama_head(c, p, keep_last_positions(llama_hidden(c, p, in, dropout_key, train, cache), in.logits_to_keep),
                    dropout_key, train);
}

Array llama_head(const LlamaConfig& c, const Params& p, const Array& hidden, const RngKey& dropout_key, bool train) {
  if (c.tie_word_embeddings && !p.contains("lm_head.weight"))
    return matmul(hidden, p["model.embed_tokens.weight"], false, true);
  return adapted_linear(hidden, p, "lm_head", Array(), {c.lora, dropout_key.fold_in(path_hash("lora")), train});
}

std::string llama_plain_head_weight(const LlamaConfig& c, const Params& p) {
  if (c.tie_word_embeddings && !p.contains("lm_head.weight")) return "model.embed_tokens.weight";
  // A LoRA adapter or a bias on the head makes it more than a product.
  return only_weight(p, "lm_head") ? "lm_head.weight" : "";
}

namespace {

// Rows of a q/k projection (heads * D, ...) whose head dims are interleaved rotary pairs
// (x_2i, x_2i+1) reordered to half-split pairs (x_i, x_{i+D/2}): per head, even rows first,
// then odd ones (the inverse of the permutation HF's LLaMA conversion script applies).
Array deinterleave_rotary_rows(const Array& w, int64_t heads) {
  std::vector<int64_t> dims = w.shape().dims();
  const int64_t d = dims[0] / heads;
  std::vector<int64_t> split = {heads, d / 2, 2};
  split.insert(split.end(), dims.begin() + 1, dims.end());
  std::vector<int> perm = {0, 2, 1};
  for (int i = 3; i < int(split.size()); ++i) perm.push_back(i);
  return reshape(transpose(reshape(w, split), perm), dims);
}

}  // namespace

ModelSpec llama_model_spec() {
  ModelSpec s;
  s.model_type = "llama";
  s.kind = ModelKind::decoder;
  s.display_name = "LLaMA";
  s.lora_targets = R"(\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)$)";
  s.base_prefix = "model.";
  s.parse_config = [](const nlohmann::json& j, const PretrainedOptions&) -> ModelConfig { return LlamaConfig::from_json(j); };
  s.config_json = [](const ModelConfig& c) { return c.as<LlamaConfig>().to_json(); };
  s.architecture = [](const ModelConfig&) -> std::string { return "LlamaForCausalLM"; };
  s.param_defs = [](const ModelConfig& c) { return llama_param_defs(c.as<LlamaConfig>()); };
  s.to_hf_layout = [](const ModelConfig& config, Params p) -> std::pair<ModelConfig, Params> {
    LlamaConfig c = config.as<LlamaConfig>();
    if (!c.rope_interleaved) return {config, std::move(p)};
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string a = "model.layers." + std::to_string(l) + ".self_attn.";
      for (const auto& [proj, heads] : {std::pair{"q_proj", c.num_attention_heads}, {"k_proj", c.num_key_value_heads}})
        for (const char* kind : {".weight", ".bias"})
          if (p.contains(a + proj + kind)) p.set(a + proj + kind, deinterleave_rotary_rows(p[a + proj + kind], heads));
    }
    c.rope_interleaved = false;
    return {ModelConfig(c), std::move(p)};
  };
  s.ignored_keys = [](const ModelConfig&) {
    return std::vector<std::string>{R"(model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)"};
  };
  s.tied_keys = [](const ModelConfig& c) {
    std::vector<std::pair<std::string, std::string>> v;
    if (c.as<LlamaConfig>().tie_word_embeddings) v.emplace_back("model.embed_tokens.weight", "lm_head.weight");
    return v;
  };
  s.causal_lm = [](const ModelConfig& c, const Params& p) { return llama_causal_lm(c.as<LlamaConfig>(), p); };
  s.decoder_hidden = [](const ModelConfig& c, const Params& p, const DecoderInputs& in, const RngKey& key, bool train) {
    return llama_hidden(c.as<LlamaConfig>(), p, in, key, train);
  };
  s.decoder_head = [](const ModelConfig& c, const Params& p, const Array& hidden, const RngKey& key, bool train) {
    return llama_head(c.as<LlamaConfig>(), p, hidden, key, train);
  };
  s.head_prefixes = {"lm_head.", "model.embed_tokens."};
  s.linear_head = [](const ModelConfig& c, const Params& p) {
    return LinearHead{llama_plain_head_weight(c.as<LlamaConfig>(), p)};
  };
  s.small_config = [](int64_t vocab, int64_t context, int64_t eos) {
    return nlohmann::json{{"model_type", "llama"},      {"vocab_size", vocab},     {"max_position_embeddings", context},
                          {"hidden_size", 128},         {"intermediate_size", 352}, {"num_hidden_layers", 4},
                          {"num_attention_heads", 4},   {"num_key_value_heads", 2}, {"bos_token_id", eos},
                          {"eos_token_id", eos}};
  };
  return s;
}

CausalLm llama_causal_lm(const LlamaConfig& c, const Params& p) {
  CausalLm lm;
  lm.model_type = "llama";
  lm.vocab_size = c.vocab_size;
  lm.max_positions = c.max_position_embeddings;
  lm.stop_tokens = {c.eos_token_id};
  lm.forward = [c, p](const DecoderInputs& in, KvCache* cache) { return llama_apply(c, p, in, {}, false, cache); };
  return lm;
}

}  // namespace mt::models
