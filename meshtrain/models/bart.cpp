#include "meshtrain/models/bart.h"

#include <cmath>

#include "meshtrain/models/lora.h"
#include "meshtrain/models/model_spec.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/nn_ops.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

namespace {
// BartLearnedPositionalEmbedding: position i reads row i + 2 (rows 0 and 1 are a fairseq
// legacy of padding offsets).
constexpr int64_t kPositionOffset = 2;

std::optional<int64_t> optional_id(const nlohmann::json& j, const char* key, std::optional<int64_t> fallback) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (it->is_null()) return std::nullopt;
  return config_get<int64_t>(j, key, "bart config");
}
}  // namespace

double BartConfig::embed_scale() const { return scale_embedding ? std::sqrt(double(d_model)) : 1.0; }

BartConfig BartConfig::from_json(const nlohmann::json& j) {
  const char* w = "bart config";
  BartConfig c;
  c.vocab_size = config_get<int64_t>(j, "vocab_size", w);
  c.max_position_embeddings = config_get<int64_t>(j, "max_position_embeddings", w, 1024);
  c.d_model = config_get<int64_t>(j, "d_model", w);
  c.encoder_layers = config_get<int64_t>(j, "encoder_layers", w);
  c.decoder_layers = config_get<int64_t>(j, "decoder_layers", w);
  c.encoder_ffn_dim = config_get<int64_t>(j, "encoder_ffn_dim", w);
  c.decoder_ffn_dim = config_get<int64_t>(j, "decoder_ffn_dim", w);
  c.encoder_attention_heads = config_get<int64_t>(j, "encoder_attention_heads", w);
  c.decoder_attention_heads = config_get<int64_t>(j, "decoder_attention_heads", w);
  c.activation_function = config_get<std::string>(j, "activation_function", w, "gelu");
  c.dropout = config_get<double>(j, "dropout", w, 0.1);
  c.attention_dropout = config_get<double>(j, "attention_dropout", w, 0.0);
  c.activation_dropout = config_get<double>(j, "activation_dropout", w, 0.0);
  c.init_std = config_get<double>(j, "init_std", w, 0.02);
  c.scale_embedding = config_get<bool>(j, "scale_embedding", w, false);
  c.tie_word_embeddings = config_get<bool>(j, "tie_word_embeddings", w, true);
  c.pad_token_id = config_get<int64_t>(j, "pad_token_id", w, 1);
  c.bos_token_id = config_get<int64_t>(j, "bos_token_id", w, 0);
  c.eos_token_id = config_get<int64_t>(j, "eos_token_id", w, 2);
  c.decoder_start_token_id = config_get<int64_t>(j, "decoder_start_token_id", w, 2);
  c.forced_bos_token_id = optional_id(j, "forced_bos_token_id", std::nullopt);
  c.forced_eos_token_id = optional_id(j, "forced_eos_token_id", int64_t(2));
  c.validate();
  return c;
}

nlohmann::json BartConfig::to_json() const {
  auto id = [](const std::optional<int64_t>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"model_type", "bart"},
          {"architectures", {"BartForConditionalGeneration"}},
          {"is_encoder_decoder", true},
          {"vocab_size", vocab_size},
          {"max_position_embeddings", max_position_embeddings},
          {"d_model", d_model},
          {"encoder_layers", encoder_layers},
          {"decoder_layers", decoder_layers},
          {"encoder_ffn_dim", encoder_ffn_dim},
          {"decoder_ffn_dim", decoder_ffn_dim},
          {"encoder_attention_heads", encoder_attention_heads},
          {"decoder_attention_heads", decoder_attention_heads},
          {"activation_function", activation_function},
          {"dropout", dropout},
          {"attention_dropout", attention_dropout},
          {"activation_dropout", activation_dropout},
          {"init_std", init_std},
          {"scale_embedding", scale_embedding},
          {"tie_word_embeddings", tie_word_embeddings},
          {"pad_token_id", pad_token_id},
          {"bos_token_id", bos_token_id},
          {"eos_token_id", eos_token_id},
          {"decoder_start_token_id", decoder_start_token_id},
          {"forced_bos_token_id", id(forced_bos_token_id)},
          {"forced_eos_token_id", id(forced_eos_token_id)}};
}

void BartConfig::validate() const {
  MT_CHECK(vocab_size > 0 && d_model > 0 && encoder_layers > 0 && decoder_layers > 0 && encoder_ffn_dim > 0 &&
               decoder_ffn_dim > 0 && encoder_attention_heads > 0 && decoder_attention_heads > 0 &&
               max_position_embeddings > 0,
           "[bart config] sizes must be positive: vocab_size ", vocab_size, ", d_model ", d_model, ", layers ",
           encoder_layers, "/", decoder_layers, ", ffn ", encoder_ffn_dim, "/", decoder_ffn_dim, ", heads ",
           encoder_attention_heads, "/", decoder_attention_heads, ", max_position_embeddings ",
           max_position_embeddings);
  MT_CHECK(d_model % encoder_attention_heads == 0 && d_model % decoder_attention_heads == 0, "[bart config] d_model ",
           d_model, " is not a multiple of the attention heads (", encoder_attention_heads, ", ",
           decoder_attention_heads, ")");
  check_activation(activation_function, "bart config");
  for (int64_t id : {pad_token_id, bos_token_id, eos_token_id, decoder_start_token_id})
    MT_CHECK(id >= 0 && id < vocab_size, "[bart config] special token id ", id, " is outside the vocabulary of ",
             vocab_size);
}

std::vector<ParamDef> bart_param_defs(const BartConfig& c) {
  c.validate();
  const int64_t e = c.d_model;
  const double s = c.init_std;
  std::vector<ParamDef> d;
  d.push_back({"model.shared.weight", {c.vocab_size, e}, embedding_role(), InitKind::normal, s, c.pad_token_id});
  auto norm = [&](const std::string& m) {
    d.push_back({m + ".weight", {e}, vector_role(ParamKind::norm), InitKind::ones});
    d.push_back({m + ".bias", {e}, vector_role(ParamKind::norm), InitKind::zeros});
  };
  auto linear = [&](const std::string& m, int64_t out, int64_t in, ParamKind kind) {
    d.push_back({m + ".weight", {out, in}, linear_role(kind), InitKind::normal, s});
    d.push_back({m + ".bias", {out}, vector_role(ParamKind::bias), InitKind::zeros});
  };
  auto attention = [&](const std::string& m) {
    for (const char* proj : {".q_proj", ".k_proj", ".v_proj"}) linear(m + proj, e, e, ParamKind::attention_qkv);
    linear(m + ".out_proj", e, e, ParamKind::attention_out);
  };
  for (const char* stack : {"encoder", "decoder"}) {
    const std::string st = std::string("model.") + stack;
    const bool dec = stack[0] == 'd';
    d.push_back({st + ".embed_positions.weight", {c.max_position_embeddings + kPositionOffset, e}, embedding_role(),
                 InitKind::normal, s});
    const int64_t layers = dec ? c.decoder_layers : c.encoder_layers, ffn = dec ? c.decoder_ffn_dim : c.encoder_ffn_dim;
    for (int64_t l = 0; l < layers; ++l) {
      const std::string b = st + ".layers." + std::to_string(l) + ".";
      attention(b + "self_attn");
      norm(b + "self_attn_layer_norm");
      if (dec) {
        attention(b + "encoder_attn");
        norm(b + "encoder_attn_layer_norm");
      }
      linear(b + "fc1", ffn, e, ParamKind::mlp_in);
      linear(b + "fc2", e, ffn, ParamKind::mlp_out);
      norm(b + "final_layer_norm");
    }
    norm(st + ".layernorm_embedding");
  }
  if (!c.tie_word_embeddings)
    d.push_back({"lm_head.weight", {c.vocab_size, e}, linear_role(ParamKind::lm_head), InitKind::normal, s});
  d.push_back({"final_logits_bias", {1, c.vocab_size}, vector_role(ParamKind::bias), InitKind::zeros});
  return d;
}

namespace {

struct BartLayer {
  BartConfig c;  // a copy: checkpointed blocks rerun after the forward returned
  int64_t heads;
  AdapterContext ac;
  bool train;

  Array linear(const Array& x, const Params& p, const std::string& m) const {
    return adapted_linear(x, p, m, p[m + ".bias"], ac);
  }
  Array project(const Array& x, const Params& p, const std::string& m) const {
    return split_heads(linear(x, p, m), heads);
  }
  Array attend(const Params& p, const std::string& m, const Array& q, const Array& k, const Array& v,
               const Array& mask, bool causal, const RngKey& key) const {
    AttentionOptions opt{.causal = causal, .scale = 0, .dropout_rate = c.attention_dropout, .dropout_key = key,
                         .train = train};
    return linear(merge_heads(scaled_dot_product_attention(q, k, v, mask, opt)), p, m + ".out_proj");
  }
  // The same from the inputs, without a cache: queries projected from xq, keys and values from
  // xkv, the heads kept inner throughout (projected_attention: no head transposes).
  Array attend_inputs(const Params& p, const std::string& m, const Array& xq, const Array& xkv, const Array& mask,
                      bool causal, const RngKey& key) const {
    AttentionOptions opt{.causal = causal, .scale = 0, .dropout_rate = c.attention_dropout, .dropout_key = key,
                         .train = train};
    const Array q = linear(xq, p, m + ".q_proj"), k = linear(xkv, p, m + ".k_proj"), v = linear(xkv, p, m + ".v_proj");
    return linear(projected_attention(q, k, v, heads, heads, mask, opt), p, m + ".out_proj");
  }
  // Post-LN: norm(x + dropout(y)).
  Array add_norm(const Array& x, const Array& y, const Params& p, const std::string& norm, const RngKey& key) const {
    return residual_layer_norm(x, y, p[norm + ".weight"], p[norm + ".bias"], 1e-5, c.dropout, key, train);
  }
  Array mlp(const Params& p, const std::string& b, const Array& x, const RngKey& key) const {
    Array h = bias_and_activation(adapted_linear(x, p, b + "fc1", Array(), ac), p[b + "fc1.bias"], c.activation_function);
    return linear(dropout(h, c.activation_dropout, key, train), p, b + "fc2");
  }
};

// Token embeddings scaled, plus learned positions start.. (offset 2), layernorm_embedding, dropout.
Array embed(const BartConfig& c, const Params& p, const std::string& stack, const Array& ids, int64_t start,
            const RngKey& key, bool train) {
  const int64_t t = ids.dim(1);
  MT_CHECK(start + t <= c.max_position_embeddings, "[bart] ", stack, " length ", start + t,
           " exceeds max_position_embeddings ", c.max_position_embeddings);
  Array x = embedding(p["model.shared.weight"], ids, c.pad_token_id);
  if (c.scale_embedding) x = mul(x, c.embed_scale());
  x = add(x, embedding(p[stack + ".embed_positions.weight"], arange_ids(start + kPositionOffset, t)));
  x = layer_norm(x, p[stack + ".layernorm_embedding.weight"], p[stack + ".layernorm_embedding.bias"], 1e-5);
  return dropout(x, c.dropout, key, train);
}

}  // namespace

EncoderOutput bart_encode(const BartConfig& c, const Params& p, const Array& input_ids, const Array& attention_mask,
                          const RngKey& dropout_key, bool train) {
  c.validate();
  const Array mask = source_mask(input_ids, attention_mask, "bart");
  const RngKey key = dropout_key.fold_in(1);
  const BartLayer layer{c, c.encoder_attention_heads, {c.lora, dropout_key.fold_in(path_hash("lora")), train}, train};
  Array x = embed(c, p, "model.encoder", input_ids, 0, key.fold_in(0), train);
  for (int64_t l = 0; l < c.encoder_layers; ++l) {
    const std::string b = "model.encoder.layers." + std::to_string(l) + ".";
    const RngKey lk = key.fold_in(uint64_t(l + 1));
    auto block = [layer, b, lk, mask](const Params& p, const Array& x0) {
      const std::string a = b + "self_attn";
      Array x = layer.add_norm(x0, layer.attend_inputs(p, a, x0, x0, mask, false, lk.fold_in(0)), p,
                               b + "self_attn_layer_norm", lk.fold_in(1));
      return layer.add_norm(x, layer.mlp(p, b, x, lk.fold_in(2)), p, b + "final_layer_norm", lk.fold_in(3));
    };
    x = transformer_block(c.remat, p, b, x, block);
  }
  return {x, mask};
}

Array bart_decode_hidden(const BartConfig& c, const Params& p, const Array& decoder_ids, const EncoderOutput& enc,
                         const Array& decoder_attention_mask, const RngKey& dropout_key, bool train,
                         Seq2SeqCache* cache) {
  c.validate();
  const int64_t past = cache ? cache->length() : 0;
  const Array self_mask = decoder_self_mask(decoder_ids, enc, decoder_attention_mask, past, "bart");
  const RngKey key = dropout_key.fold_in(2);
  const BartLayer layer{c, c.decoder_attention_heads, {c.lora, dropout_key.fold_in(path_hash("lora")), train}, train};
  Array x = embed(c, p, "model.decoder", decoder_ids, past, key.fold_in(0), train);
  const Array enc_mask = enc.mask;
  for (int64_t l = 0; l < c.decoder_layers; ++l) {
    const std::string b = "model.decoder.layers." + std::to_string(l) + ".";
    const RngKey lk = key.fold_in(uint64_t(l + 1));
    auto block = [layer, b, lk, self_mask, enc_mask, cache, l](const Params& p, const std::vector<Array>& in) {
      const std::string sa = b + "self_attn", ca = b + "encoder_attn";
      if (!cache) {  // training and scoring: the heads stay inner
        Array x = layer.add_norm(in[0], layer.attend_inputs(p, sa, in[0], in[0], self_mask, true, lk.fold_in(0)), p,
                                 b + "self_attn_layer_norm", lk.fold_in(1));
        x = layer.add_norm(x, layer.attend_inputs(p, ca, x, in[1], enc_mask, false, lk.fold_in(2)), p,
                           b + "encoder_attn_layer_norm", lk.fold_in(3));
        return layer.add_norm(x, layer.mlp(p, b, x, lk.fold_in(4)), p, b + "final_layer_norm", lk.fold_in(5));
      }
      Array q = layer.project(in[0], p, sa + ".q_proj"), k = layer.project(in[0], p, sa + ".k_proj"),
            v = layer.project(in[0], p, sa + ".v_proj");
      if (cache) std::tie(k, v) = cache->self.append(size_t(l), k, v);
      Array x = layer.add_norm(in[0], layer.attend(p, sa, q, k, v, self_mask, true, lk.fold_in(0)), p,
                               b + "self_attn_layer_norm", lk.fold_in(1));
      auto cross_kv = [&] {
        return std::make_pair(layer.project(in[1], p, ca + ".k_proj"), layer.project(in[1], p, ca + ".v_proj"));
      };
      auto [ck, cv] = cache ? cache->cross(size_t(l), cross_kv) : cross_kv();
      x = layer.add_norm(x, layer.attend(p, ca, layer.project(x, p, ca + ".q_proj"), ck, cv, enc_mask, false,
                                         lk.fold_in(2)),
                         p, b + "encoder_attn_layer_norm", lk.fold_in(3));
      return layer.add_norm(x, layer.mlp(p, b, x, lk.fold_in(4)), p, b + "final_layer_norm", lk.fold_in(5));
    };
    x = transformer_block(c.remat, p, b, {x, enc.hidden}, block);
  }
  return x;
}

Array bart_head(const BartConfig& c, const Params& p, const Array& hidden, const RngKey& dropout_key, bool train) {
  Array logits = c.tie_word_embeddings
                     ? matmul(hidden, p["model.shared.weight"], false, true)
                     : adapted_linear(hidden, p, "lm_head", Array(), {c.lora, dropout_key.fold_in(path_hash("lora")), train});
  return add(logits, p["final_logits_bias"]);
}

Array bart_hidden(const BartConfig& c, const Params& p, const Seq2SeqInputs& in, const RngKey& dropout_key,
                  bool train) {
  const EncoderOutput enc = bart_encode(c, p, in.input_ids, in.attention_mask, dropout_key, train);
  return bart_decode_hidden(c, p, in.decoder_input_ids, enc, in.decoder_attention_mask, dropout_key, train);
}

Array bart_apply(const BartConfig& c, const Params& p, const Seq2SeqInputs& in, const RngKey& dropout_key,
                 bool train) {
  return bart_head(c, p, bart_hidden(c, p, in, dropout_key, train), dropout_key, train);
}

Seq2SeqLm bart_seq2seq_lm(const BartConfig& c, const Params& p) {
  Seq2SeqLm lm;
  lm.model_type = "bart";
  lm.vocab_size = c.vocab_size;
  lm.max_source_positions = lm.max_target_positions = c.max_position_embeddings;
  lm.decoder_start_token_id = c.decoder_start_token_id;
  lm.pad_token_id = c.pad_token_id;
  lm.eos_token_id = c.eos_token_id;
  lm.forced_bos_token_id = c.forced_bos_token_id;
  lm.forced_eos_token_id = c.forced_eos_token_id;
  lm.encode = [c, p](const Array& ids, const Array& mask) { return bart_encode(c, p, ids, mask); };
  lm.decode = [c, p](const Array& ids, const EncoderOutput& enc, Seq2SeqCache* cache) {
    return bart_head(c, p, bart_decode_hidden(c, p, ids, enc, Array(), {}, false, cache));
  };
  return lm;
}

ModelSpec bart_model_spec() {
  ModelSpec s;
  s.model_type = "bart";
  s.kind = ModelKind::seq2seq;
  s.display_name = "BART";
  s.lora_targets = R"(\.(self_attn|encoder_attn)\.(q_proj|v_proj)$)";  // PEFT's default for BART
  s.config_aliases = {{"hidden_size", "d_model"}, {"num_attention_heads", "encoder_attention_heads"}};
  s.parse_config = [](const nlohmann::json& j, const PretrainedOptions&) -> ModelConfig {
    return BartConfig::from_json(j);
  };
  s.config_json = [](const ModelConfig& c) { return c.as<BartConfig>().to_json(); };
  s.architecture = [](const ModelConfig&) -> std::string { return "BartForConditionalGeneration"; };
  s.param_defs = [](const ModelConfig& c) { return bart_param_defs(c.as<BartConfig>()); };
  s.ignored_keys = [](const ModelConfig&) {
    return std::vector<std::string>{R"(model\.(encoder|decoder)\.embed_tokens\.weight)"};
  };
  s.tied_keys = [](const ModelConfig& c) {
    std::vector<std::pair<std::string, std::string>> tied{{"model.shared.weight", "model.encoder.embed_tokens.weight"},
                                                          {"model.shared.weight", "model.decoder.embed_tokens.weight"}};
    if (c.as<BartConfig>().tie_word_embeddings) tied.push_back({"model.shared.weight", "lm_head.weight"});
    return tied;
  };
  s.buffers = {"final_logits_bias"};
  s.seq2seq_lm = [](const ModelConfig& c, const Params& p) { return bart_seq2seq_lm(c.as<BartConfig>(), p); };
  s.seq2seq_hidden = [](const ModelConfig& c, const Params& p, const Seq2SeqInputs& in, const RngKey& key, bool train) {
    return bart_hidden(c.as<BartConfig>(), p, in, key, train);
  };
  s.decoder_head = [](const ModelConfig& c, const Params& p, const Array& hidden, const RngKey& key, bool train) {
    return bart_head(c.as<BartConfig>(), p, hidden, key, train);
  };
  s.head_prefixes = {"model.shared.", "lm_head.", "final_logits_bias"};  // tied or untied
  s.linear_head = [](const ModelConfig& c, const Params& p) {
    if (c.as<BartConfig>().tie_word_embeddings) return LinearHead{"model.shared.weight", "final_logits_bias"};
    return only_weight(p, "lm_head") ? LinearHead{"lm_head.weight", "final_logits_bias"} : LinearHead{};
  };
  s.small_seq2seq_config = [](int64_t vocab, int64_t pad, int64_t eos) {
    return nlohmann::json{{"model_type", "bart"},   {"vocab_size", vocab},       {"d_model", 128},
                          {"encoder_layers", 2},    {"decoder_layers", 2},       {"encoder_ffn_dim", 256},
                          {"decoder_ffn_dim", 256}, {"encoder_attention_heads", 4}, {"decoder_attention_heads", 4},
                          {"max_position_embeddings", 256}, {"pad_token_id", pad}, {"eos_token_id", eos},
                          {"bos_token_id", eos},   {"decoder_start_token_id", eos}, {"forced_eos_token_id", eos}};
  };
  return s;
}

}  // namespace mt::models
