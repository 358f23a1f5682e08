#include "meshtrain/models/t5.h"

#include <cmath>

#include "meshtrain/core/device_constants.h"
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

bool T5Config::gated() const { return feed_forward_proj.rfind("gated-", 0) == 0; }

std::string T5Config::activation() const {
  std::string act = gated() ? feed_forward_proj.substr(6) : feed_forward_proj;
  return act == "gelu" && gated() ? "gelu_new" : act;  // transformers maps gated-gelu to the tanh GELU
}

T5Config T5Config::from_json(const nlohmann::json& j) {
  const char* w = "t5 config";
  T5Config c;
  c.vocab_size = config_get<int64_t>(j, "vocab_size", w);
  c.d_model = config_get<int64_t>(j, "d_model", w);
  c.d_kv = config_get<int64_t>(j, "d_kv", w);
  c.d_ff = config_get<int64_t>(j, "d_ff", w);
  c.num_layers = config_get<int64_t>(j, "num_layers", w);
  c.num_decoder_layers = config_get<int64_t>(j, "num_decoder_layers", w, c.num_layers);
  c.num_heads = config_get<int64_t>(j, "num_heads", w);
  c.relative_attention_num_buckets = config_get<int64_t>(j, "relative_attention_num_buckets", w, 32);
  c.relative_attention_max_distance = config_get<int64_t>(j, "relative_attention_max_distance", w, 128);
  c.dropout_rate = config_get<double>(j, "dropout_rate", w, 0.1);
  c.layer_norm_epsilon = config_get<double>(j, "layer_norm_epsilon", w, 1e-6);
  c.initializer_factor = config_get<double>(j, "initializer_factor", w, 1.0);
  c.feed_forward_proj = config_get<std::string>(j, "feed_forward_proj", w, "relu");
  c.tie_word_embeddings = config_get<bool>(j, "tie_word_embeddings", w, true);
  c.pad_token_id = config_get<int64_t>(j, "pad_token_id", w, 0);
  c.eos_token_id = config_get<int64_t>(j, "eos_token_id", w, 1);
  c.decoder_start_token_id = config_get<int64_t>(j, "decoder_start_token_id", w, c.pad_token_id);
  c.validate();
  return c;
}

nlohmann::json T5Config::to_json() const {
  return {{"model_type", "t5"},
          {"architectures", {"T5ForConditionalGeneration"}},
          {"is_encoder_decoder", true},
          {"vocab_size", vocab_size},
          {"d_model", d_model},
          {"d_kv", d_kv},
          {"d_ff", d_ff},
          {"num_layers", num_layers},
          {"num_decoder_layers", num_decoder_layers},
          {"num_heads", num_heads},
          {"relative_attention_num_buckets", relative_attention_num_buckets},
          {"relative_attention_max_distance", relative_attention_max_distance},
          {"dropout_rate", dropout_rate},
          {"layer_norm_epsilon", layer_norm_epsilon},
          {"initializer_factor", initializer_factor},
          {"feed_forward_proj", feed_forward_proj},
          {"tie_word_embeddings", tie_word_embeddings},
          {"pad_token_id", pad_token_id},
          {"eos_token_id", eos_token_id},
          {"decoder_start_token_id", decoder_start_token_id}};
}

void T5Config::validate() const {
  MT_CHECK(vocab_size > 0 && d_model > 0 && d_kv > 0 && d_ff > 0 && num_layers > 0 && num_decoder_layers > 0 &&
               num_heads > 0,
           "[t5 config] sizes must be positive: vocab_size ", vocab_size, ", d_model ", d_model, ", d_kv ", d_kv,
           ", d_ff ", d_ff, ", num_layers ", num_layers, ", num_decoder_layers ", num_decoder_layers, ", num_heads ",
           num_heads);
  MT_CHECK(relative_attention_num_buckets >= 4 && relative_attention_max_distance > relative_attention_num_buckets / 2,
           "[t5 config] relative_attention_num_buckets ", relative_attention_num_buckets,
           " must be >= 4 and relative_attention_max_distance ", relative_attention_max_distance,
           " above half of it");
  const std::string act = feed_forward_proj.rfind("gated-", 0) == 0 ? feed_forward_proj.substr(6) : feed_forward_proj;
  MT_CHECK(!act.empty() && act.find('-') == std::string::npos, "[t5 config] feed_forward_proj '", feed_forward_proj,
           "' is not '<act>' or 'gated-<act>'");
  check_activation(activation(), "t5 config");
  for (int64_t id : {pad_token_id, eos_token_id, decoder_start_token_id})
    MT_CHECK(id >= 0 && id < vocab_size, "[t5 config] special token id ", id, " is outside the vocabulary of ",
             vocab_size);
}

std::vector<ParamDef> t5_param_defs(const T5Config& c) {
  c.validate();
  const int64_t e = c.d_model, inner = c.inner(), f = c.d_ff;
  const double fac = c.initializer_factor;
  // transformers' T5PreTrainedModel._init_weights
  const double q_std = fac / std::sqrt(double(e * c.d_kv)), kv_std = fac / std::sqrt(double(e)),
               o_std = fac / std::sqrt(double(inner)), wo_std = fac / std::sqrt(double(f));
  std::vector<ParamDef> d;
  d.push_back({"shared.weight", {c.vocab_size, e}, embedding_role(), InitKind::normal, fac});
  auto norm = [&](const std::string& path) {
    d.push_back({path, {e}, vector_role(ParamKind::norm), InitKind::ones});
  };
  auto attention = [&](const std::string& m, bool relative_bias) {
    d.push_back({m + ".q.weight", {inner, e}, linear_role(ParamKind::attention_qkv), InitKind::normal, q_std});
    d.push_back({m + ".k.weight", {inner, e}, linear_role(ParamKind::attention_qkv), InitKind::normal, kv_std});
    d.push_back({m + ".v.weight", {inner, e}, linear_role(ParamKind::attention_qkv), InitKind::normal, kv_std});
    d.push_back({m + ".o.weight", {e, inner}, linear_role(ParamKind::attention_out), InitKind::normal, o_std});
    if (relative_bias)
      d.push_back({m + ".relative_attention_bias.weight", {c.relative_attention_num_buckets, c.num_heads},
                   ParamRole{ParamKind::position_bias, 0, 1}, InitKind::normal, kv_std});
  };
  auto mlp = [&](const std::string& m) {
    for (const char* wi : c.gated() ? std::vector<const char*>{".wi_0", ".wi_1"} : std::vector<const char*>{".wi"})
      d.push_back({m + wi + ".weight", {f, e}, linear_role(ParamKind::mlp_in), InitKind::normal, kv_std});
    d.push_back({m + ".wo.weight", {e, f}, linear_role(ParamKind::mlp_out), InitKind::normal, wo_std});
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string b = "encoder.block." + std::to_string(l) + ".layer.";
    attention(b + "0.SelfAttention", l == 0);
    norm(b + "0.layer_norm.weight");
    mlp(b + "1.DenseReluDense");
    norm(b + "1.layer_norm.weight");
  }
  norm("encoder.final_layer_norm.weight");
  for (int64_t l = 0; l < c.num_decoder_layers; ++l) {
    const std::string b = "decoder.block." + std::to_string(l) + ".layer.";
    attention(b + "0.SelfAttention", l == 0);
    norm(b + "0.layer_norm.weight");
    attention(b + "1.EncDecAttention", false);
    norm(b + "1.layer_norm.weight");
    mlp(b + "2.DenseReluDense");
    norm(b + "2.layer_norm.weight");
  }
  norm("decoder.final_layer_norm.weight");
  if (!c.tie_word_embeddings)
    d.push_back({"lm_head.weight", {c.vocab_size, e}, linear_role(ParamKind::lm_head), InitKind::normal, fac});
  return d;
}

int64_t t5_relative_position_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets,
                                    int64_t max_distance) {
  int64_t bucket = 0, n = num_buckets, rel = relative_position;
  if (bidirectional) {
    n /= 2;
    if (rel > 0) bucket += n;
    rel = rel < 0 ? -rel : rel;
  } else {
    rel = rel < 0 ? -rel : 0;
  }
  const int64_t max_exact = n / 2;
  if (rel < max_exact) return bucket + rel;
  // The same f32 operations as transformers, so bucket edges fall where they do there.
  const float scaled = std::log(float(rel) / float(max_exact)) /
                       float(std::log(double(max_distance) / double(max_exact))) * float(n - max_exact);
  return bucket + std::min<int64_t>(max_exact + int64_t(scaled), n - 1);
}

Array t5_position_bias(const T5Config& c, const Array& table, int64_t q_start, int64_t tq, int64_t tk,
                       bool bidirectional) {
  // The buckets depend on the shape alone: made once per shape and device, not uploaded again
  // by every forward.
  const std::string key = "t5_buckets " + std::to_string(q_start) + " " + std::to_string(tq) + " " +
                          std::to_string(tk) + " " + std::to_string(int(bidirectional)) + " " +
                          std::to_string(c.relative_attention_num_buckets) + " " +
                          std::to_string(c.relative_attention_max_distance);
  auto make = [&] {
    std::vector<int64_t> b(static_cast<size_t>(tq * tk));
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t j = 0; j < tk; ++j)
        b[size_t(i * tk + j)] = t5_relative_position_bucket(j - (q_start + i), bidirectional,
                                                            c.relative_attention_num_buckets,
                                                            c.relative_attention_max_distance);
    return Array::from_vector(b, Shape{tq, tk});
  };
  // One decoding position (tq 1) differs at every call: not kept.
  const Array buckets = tq == 1 ? make() : device_constant(key, current_device(), make);
  Array values = embedding(table, buckets);  // (Tq, Tk, H)
  return expand_dims(transpose(values, {2, 0, 1}), 0);
}

namespace {

struct T5Layer {
  T5Config c;  // a copy: checkpointed blocks rerun after the forward returned
  AdapterContext ac;
  bool train;

  Array norm(const Array& x, const Params& p, const std::string& path) const {
    return rms_norm(x, p[path], c.layer_norm_epsilon);
  }
  Array project(const Array& x, const Params& p, const std::string& module) const {
    return split_heads(adapted_linear(x, p, module, Array(), ac), c.num_heads);
  }
  // T5Attention: unscaled scores plus the position bias, dropout on the probabilities.
  Array attend(const Params& p, const std::string& m, const Array& q, const Array& k, const Array& v,
               const Array& mask, const Array& bias, bool causal, const RngKey& key) const {
    AttentionOptions opt{.causal = causal, .scale = 1.0, .dropout_rate = c.dropout_rate, .dropout_key = key,
                         .train = train, .bias = bias};
    Array a = merge_heads(scaled_dot_product_attention(q, k, v, mask, opt));
    return adapted_linear(a, p, m + ".o", Array(), ac);
  }
  Array mlp(const Params& p, const std::string& m, const Array& h, const RngKey& key) const {
    Array a = c.gated() ? mul(activation(adapted_linear(h, p, m + ".wi_0", Array(), ac), c.activation()),
                              adapted_linear(h, p, m + ".wi_1", Array(), ac))
                        : activation(adapted_linear(h, p, m + ".wi", Array(), ac), c.activation());
    a = dropout(a, c.dropout_rate, key, train);
    return adapted_linear(a, p, m + ".wo", Array(), ac);
  }
  Array residual(const Array& x, const Array& y, const RngKey& key) const {
    return residual_add(x, y, c.dropout_rate, key, train);
  }
};

}  // namespace

EncoderOutput t5_encode(const T5Config& c, const Params& p, const Array& input_ids, const Array& attention_mask,
                        const RngKey& dropout_key, bool train) {
  c.validate();
  const Array mask = source_mask(input_ids, attention_mask, "t5");
  const int64_t s = input_ids.dim(1);
  const RngKey key = dropout_key.fold_in(1);
  const T5Layer layer{c, {c.lora, dropout_key.fold_in(path_hash("lora")), train}, train};
  Array x = dropout(embedding(p["shared.weight"], input_ids), c.dropout_rate, key.fold_in(0), train);
  const Array bias =
      t5_position_bias(c, p["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], 0, s, s, true);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string b = "encoder.block." + std::to_string(l) + ".layer.";
    const RngKey lk = key.fold_in(uint64_t(l + 1));
    auto block = [layer, b, lk, mask](const Params& p, const std::vector<Array>& in) {
      Array x = in[0];
      const std::string a = b + "0.SelfAttention";
      Array h = layer.norm(x, p, b + "0.layer_norm.weight");
      Array q = layer.project(h, p, a + ".q"), k = layer.project(h, p, a + ".k"), v = layer.project(h, p, a + ".v");
      x = layer.residual(x, layer.attend(p, a, q, k, v, mask, in[1], false, lk.fold_in(0)), lk.fold_in(1));
      h = layer.norm(x, p, b + "1.layer_norm.weight");
      return layer.residual(x, layer.mlp(p, b + "1.DenseReluDense", h, lk.fold_in(2)), lk.fold_in(3));
    };
    x = transformer_block(c.remat, p, "encoder.block." + std::to_string(l) + ".", {x, bias}, block);
  }
  x = rms_norm(x, p["encoder.final_layer_norm.weight"], c.layer_norm_epsilon);
  return {dropout(x, c.dropout_rate, key.fold_in(uint64_t(c.num_layers + 1)), train), mask};
}

Array t5_decode_hidden(const T5Config& c, const Params& p, const Array& decoder_ids, const EncoderOutput& enc,
                       const Array& decoder_attention_mask, const RngKey& dropout_key, bool train,
                       Seq2SeqCache* cache) {
  c.validate();
  const int64_t past = cache ? cache->length() : 0;
  const Array self_mask = decoder_self_mask(decoder_ids, enc, decoder_attention_mask, past, "t5");
  const int64_t t = decoder_ids.dim(1);
  const RngKey key = dropout_key.fold_in(2);
  const T5Layer layer{c, {c.lora, dropout_key.fold_in(path_hash("lora")), train}, train};
  Array x = dropout(embedding(p["shared.weight"], decoder_ids), c.dropout_rate, key.fold_in(0), train);
  const Array bias = t5_position_bias(c, p["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
                                      past, t, past + t, false);
  const Array enc_mask = enc.mask;
  for (int64_t l = 0; l < c.num_decoder_layers; ++l) {
    const std::string b = "decoder.block." + std::to_string(l) + ".layer.";
    const RngKey lk = key.fold_in(uint64_t(l + 1));
    auto block = [layer, b, lk, self_mask, enc_mask, cache, l](const Params& p, const std::vector<Array>& in) {
      Array x = in[0];
      const std::string sa = b + "0.SelfAttention", ca = b + "1.EncDecAttention";
      Array h = layer.norm(x, p, b + "0.layer_norm.weight");
      Array q = layer.project(h, p, sa + ".q"), k = layer.project(h, p, sa + ".k"), v = layer.project(h, p, sa + ".v");
      if (cache) std::tie(k, v) = cache->self.append(size_t(l), k, v);
      x = layer.residual(x, layer.attend(p, sa, q, k, v, self_mask, in[1], true, lk.fold_in(0)), lk.fold_in(1));
      h = layer.norm(x, p, b + "1.layer_norm.weight");
      auto cross_kv = [&] {
        return std::make_pair(layer.project(in[2], p, ca + ".k"), layer.project(in[2], p, ca + ".v"));
      };
      auto [ck, cv] = cache ? cache->cross(size_t(l), cross_kv) : cross_kv();
      x = layer.residual(x, layer.attend(p, ca, layer.project(h, p, ca + ".q"), ck, cv, enc_mask, Array(), false,
                                         lk.fold_in(2)),
                         lk.fold_in(3));
      h = layer.norm(x, p, b + "2.layer_norm.weight");
      return layer.residual(x, layer.mlp(p, b + "2.DenseReluDense", h, lk.fold_in(4)), lk.fold_in(5));
    };
    x = transformer_block(c.remat, p, "decoder.block." + std::to_string(l) + ".", {x, bias, enc.hidden}, block);
  }
  x = rms_norm(x, p["decoder.final_layer_norm.weight"], c.layer_norm_epsilon);
  return dropout(x, c.dropout_rate, key.fold_in(uint64_t(c.num_decoder_layers + 1)), train);
}

Array t5_head(const T5Config& c, const Params& p, const Array& hidden, const RngKey& dropout_key, bool train) {
  if (c.tie_word_embeddings)  // the tied head rescales, as Mesh TensorFlow's T5 did
    return matmul(mul(hidden, 1.0 / std::sqrt(double(c.d_model))), p["shared.weight"], false, true);
  return adapted_linear(hidden, p, "lm_head", Array(), {c.lora, dropout_key.fold_in(path_hash("lora")), train});
}

Array t5_hidden(const T5Config& c, const Params& p, const Seq2SeqInputs& in, const RngKey& dropout_key, bool train) {
  const EncoderOutput enc = t5_encode(c, p, in.input_ids, in.attention_mask, dropout_key, train);
  return t5_decode_hidden(c, p, in.decoder_input_ids, enc, in.decoder_attention_mask, dropout_key, train);
}

Array t5_apply(const T5Config& c, const Params& p, const Seq2SeqInputs& in, const RngKey& dropout_key, bool train) {
  return t5_head(c, p, t5_hidden(c, p, in, dropout_key, train), dropout_key, train);
}

Seq2SeqLm t5_seq2seq_lm(const T5Config& c, const Params& p) {
  Seq2SeqLm lm;
  lm.model_type = "t5";
  lm.vocab_size = c.vocab_size;
  lm.decoder_start_token_id = c.decoder_start_token_id;
  lm.pad_token_id = c.pad_token_id;
  lm.eos_token_id = c.eos_token_id;
  lm.encode = [c, p](const Array& ids, const Array& mask) { return t5_encode(c, p, ids, mask); };
  lm.decode = [c, p](const Array& ids, const EncoderOutput& enc, Seq2SeqCache* cache) {
    return t5_head(c, p, t5_decode_hidden(c, p, ids, enc, Array(), {}, false, cache));
  };
  return lm;
}

ModelSpec t5_model_spec() {
  ModelSpec s;
  s.model_type = "t5";
  s.kind = ModelKind::seq2seq;
  s.display_name = "T5";
  s.lora_targets = R"(\.(SelfAttention|EncDecAttention)\.(q|v)$)";  // PEFT's default for T5
  s.config_aliases = {{"hidden_size", "d_model"}, {"num_attention_heads", "num_heads"}, {"num_hidden_layers", "num_layers"}};
  s.parse_config = [](const nlohmann::json& j, const PretrainedOptions&) -> ModelConfig { return T5Config::from_json(j); };
  s.config_json = [](const ModelConfig& c) { return c.as<T5Config>().to_json(); };
  s.architecture = [](const ModelConfig&) -> std::string { return "T5ForConditionalGeneration"; };
  s.param_defs = [](const ModelConfig& c) { return t5_param_defs(c.as<T5Config>()); };
  s.ignored_keys = [](const ModelConfig&) {
    return std::vector<std::string>{R"((encoder|decoder)\.embed_tokens\.weight)"};
  };
  s.tied_keys = [](const ModelConfig& c) {
    std::vector<std::pair<std::string, std::string>> tied{{"shared.weight", "encoder.embed_tokens.weight"},
                                                          {"shared.weight", "decoder.embed_tokens.weight"}};
    if (c.as<T5Config>().tie_word_embeddings) tied.push_back({"shared.weight", "lm_head.weight"});
    return tied;
  };
  s.seq2seq_lm = [](const ModelConfig& c, const Params& p) { return t5_seq2seq_lm(c.as<T5Config>(), p); };
  s.seq2seq_hidden = [](const ModelConfig& c, const Params& p, const Seq2SeqInputs& in, const RngKey& key, bool train) {
    return t5_hidden(c.as<T5Config>(), p, in, key, train);
  };
  s.decoder_head = [](const ModelConfig& c, const Params& p, const Array& hidden, const RngKey& key, bool train) {
    return t5_head(c.as<T5Config>(), p, hidden, key, train);
  };
  s.head_prefixes = {"shared.", "lm_head."};  // tied or untied
  s.linear_head = [](const ModelConfig& c, const Params& p) {
    const T5Config& t5 = c.as<T5Config>();
    if (t5.tie_word_embeddings) return LinearHead{"shared.weight", "", 1.0 / std::sqrt(double(t5.d_model))};
    return only_weight(p, "lm_head") ? LinearHead{"lm_head.weight"} : LinearHead{};
  };
  s.small_seq2seq_config = [](int64_t vocab, int64_t pad, int64_t eos) {
    return nlohmann::json{{"model_type", "t5"}, {"vocab_size", vocab},     {"d_model", 128},   {"d_kv", 32},
                          {"d_ff", 256},        {"num_layers", 2},         {"num_heads", 4},   {"pad_token_id", pad},
                          {"eos_token_id", eos}, {"decoder_start_token_id", pad},
                          {"feed_forward_proj", "gated-gelu"}, {"tie_word_embeddings", false},
                          {"relative_attention_num_buckets", 32}, {"relative_attention_max_distance", 128}};
  };
  return s;
}

}  // namespace mt::models
