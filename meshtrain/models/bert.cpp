#include "meshtrain/models/bert.h"

#include "meshtrain/models/class_labels.h"
#include "meshtrain/models/lora.h"
#include "meshtrain/models/model_spec.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/nn_ops.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

const char* bert_architecture(BertHead head) {
  switch (head) {
    case BertHead::none: return "BertModel";
    case BertHead::sequence_classification: return "BertForSequenceClassification";
    case BertHead::masked_lm: return "BertForMaskedLM";
  }
  return "BertModel";
}

BertConfig BertConfig::with_head(BertHead h) const {
  BertConfig c = *this;
  c.head = h;
  c.add_pooling_layer = h != BertHead::masked_lm;
  return c;
}

BertConfig BertConfig::from_json(const nlohmann::json& j) {
  const char* w = "bert config";
  BertConfig c;
  c.vocab_size = config_get<int64_t>(j, "vocab_size", w);
  c.hidden_size = config_get<int64_t>(j, "hidden_size", w);
  c.num_hidden_layers = config_get<int64_t>(j, "num_hidden_layers", w);
  c.num_attention_heads = config_get<int64_t>(j, "num_attention_heads", w);
  c.intermediate_size = config_get<int64_t>(j, "intermediate_size", w);
  c.hidden_act = config_get<std::string>(j, "hidden_act", w, "gelu");
  c.hidden_dropout_prob = config_get<double>(j, "hidden_dropout_prob", w, 0.1);
  c.attention_probs_dropout_prob = config_get<double>(j, "attention_probs_dropout_prob", w, 0.1);
  c.classifier_dropout = config_get<double>(j, "classifier_dropout", w, -1.0);
  c.max_position_embeddings = config_get<int64_t>(j, "max_position_embeddings", w, 512);
  c.type_vocab_size = config_get<int64_t>(j, "type_vocab_size", w, 2);
  c.initializer_range = config_get<double>(j, "initializer_range", w, 0.02);
  c.layer_norm_eps = config_get<double>(j, "layer_norm_eps", w, 1e-12);
  c.pad_token_id = config_get<int64_t>(j, "pad_token_id", w, 0);
  c.is_decoder = config_get<bool>(j, "is_decoder", w, false);
  std::string pos = config_get<std::string>(j, "position_embedding_type", w, "absolute");
  MT_CHECK(pos == "absolute", "[", w, "] position_embedding_type '", pos, "' is not supported (only 'absolute')");
  ClassLabels labels = read_class_labels(j, w);
  c.num_labels = labels.num_labels;
  c.label_names = std::move(labels.names);
  std::string arch = "BertModel";
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty())
    arch = j["architectures"][0].get<std::string>();
  if (arch == "BertForSequenceClassification") c = c.with_head(BertHead::sequence_classification);
  else if (arch == "BertForMaskedLM" || arch == "BertLMHeadModel") c = c.with_head(BertHead::masked_lm);
  else if (arch == "BertForPreTraining") c = c.with_head(BertHead::masked_lm), c.add_pooling_layer = true;
  else c = c.with_head(BertHead::none);
  c.validate();
  return c;
}

nlohmann::json BertConfig::to_json() const {
  nlohmann::json j = {{"model_type", "bert"},
          {"architectures", {bert_architecture(head)}},
          {"vocab_size", vocab_size},
          {"hidden_size", hidden_size},
          {"num_hidden_layers", num_hidden_layers},
          {"num_attention_heads", num_attention_heads},
          {"intermediate_size", intermediate_size},
          {"hidden_act", hidden_act},
          {"hidden_dropout_prob", hidden_dropout_prob},
          {"attention_probs_dropout_prob", attention_probs_dropout_prob},
          {"classifier_dropout", classifier_dropout >= 0 ? nlohmann::json(classifier_dropout) : nlohmann::json(nullptr)},
          {"max_position_embeddings", max_position_embeddings},
          {"type_vocab_size", type_vocab_size},
          {"initializer_range", initializer_range},
          {"layer_norm_eps", layer_norm_eps},
          {"pad_token_id", pad_token_id},
          {"is_decoder", is_decoder},
          {"position_embedding_type", "absolute"}};
  write_class_labels(j, num_labels, label_names);
  return j;
}

void BertConfig::validate() const {
  MT_CHECK(vocab_size > 0 && hidden_size > 0 && num_hidden_layers > 0 && num_attention_heads > 0 &&
               intermediate_size > 0 && max_position_embeddings > 0 && type_vocab_size > 0,
           "[bert config] sizes must be positive: vocab_size ", vocab_size, ", hidden_size ", hidden_size,
           ", num_hidden_layers ", num_hidden_layers, ", num_attention_heads ", num_attention_heads,
           ", intermediate_size ", intermediate_size);
  MT_CHECK(hidden_size % num_attention_heads == 0, "[bert config] hidden_size ", hidden_size,
           " is not a multiple of num_attention_heads ", num_attention_heads);
  MT_CHECK(head != BertHead::sequence_classification || num_labels > 0, "[bert config] num_labels must be positive, got ",
           num_labels);
  MT_CHECK(head != BertHead::sequence_classification || add_pooling_layer,
           "[bert config] sequence classification needs the pooler");
  check_activation(hidden_act, "bert config");
}

std::vector<ParamDef> bert_param_defs(const BertConfig& c) {
  c.validate();
  const int64_t e = c.hidden_size, f = c.intermediate_size;
  const double std = c.initializer_range;
  std::vector<ParamDef> d;
  auto lin = [&](const std::string& p, int64_t out, int64_t in, ParamKind kind) {
    d.push_back({p + ".weight", {out, in}, linear_role(kind), InitKind::normal, std});
    d.push_back({p + ".bias", {out}, vector_role(ParamKind::bias), InitKind::zeros});
  };
  auto norm = [&](const std::string& p) {
    d.push_back({p + ".weight", {e}, vector_role(ParamKind::norm), InitKind::ones});
    d.push_back({p + ".bias", {e}, vector_role(ParamKind::norm), InitKind::zeros});
  };
  d.push_back({"bert.embeddings.word_embeddings.weight", {c.vocab_size, e}, embedding_role(), InitKind::normal, std,
               c.pad_token_id});
  d.push_back({"bert.embeddings.position_embeddings.weight", {c.max_position_embeddings, e}, embedding_role(),
               InitKind::normal, std});
  d.push_back({"bert.embeddings.token_type_embeddings.weight", {c.type_vocab_size, e}, embedding_role(),
               InitKind::normal, std});
  norm("bert.embeddings.LayerNorm");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string b = "bert.encoder.layer." + std::to_string(l) + ".";
    lin(b + "attention.self.query", e, e, ParamKind::attention_qkv);
    lin(b + "attention.self.key", e, e, ParamKind::attention_qkv);
    lin(b + "attention.self.value", e, e, ParamKind::attention_qkv);
    lin(b + "attention.output.dense", e, e, ParamKind::attention_out);
    norm(b + "attention.output.LayerNorm");
    lin(b + "intermediate.dense", f, e, ParamKind::mlp_in);
    lin(b + "output.dense", e, f, ParamKind::mlp_out);
    norm(b + "output.LayerNorm");
  }
  if (c.add_pooling_layer) lin("bert.pooler.dense", e, e, ParamKind::dense);
  if (c.head == BertHead::sequence_classification) lin("classifier", c.num_labels, e, ParamKind::dense);
  if (c.head == BertHead::masked_lm) {
    lin("cls.predictions.transform.dense", e, e, ParamKind::dense);
    norm("cls.predictions.transform.LayerNorm");
    d.push_back({"cls.predictions.bias", {c.vocab_size}, vector_role(ParamKind::bias), InitKind::zeros});
  }
  return d;
}

ParamRoles bert_param_roles(const BertConfig& c) { return roles_of(bert_param_defs(c)); }

Params bert_init(const BertConfig& c, const RngKey& key, DType dtype) {
  return init_params(bert_param_defs(c), key, dtype);
}

Array bert_encoder(const BertConfig& c, const Params& p, const BertInputs& in, const RngKey& dropout_key, bool train) {
  c.validate();
  MT_CHECK(in.input_ids.defined() && in.input_ids.ndim() == 2 && is_integer(in.input_ids.dtype()),
           "[bert] input_ids must be integer (B, T), got ", in.input_ids.defined() ? in.input_ids.str() : "undefined");
  const int64_t b = in.input_ids.dim(0), t = in.input_ids.dim(1);
  MT_CHECK(t <= c.max_position_embeddings, "[bert] sequence length ", t, " exceeds max_position_embeddings ",
           c.max_position_embeddings);
  auto check_bt = [&](const Array& a, const char* name) {
    MT_CHECK(!a.defined() || (a.ndim() == 2 && a.dim(0) == b && a.dim(1) == t), "[bert] ", name, " ", a.str(),
             " must match input_ids ", in.input_ids.str());
  };
  check_bt(in.attention_mask, "attention_mask");
  check_bt(in.token_type_ids, "token_type_ids");
  Array positions = in.position_ids;
  if (!positions.defined()) positions = arange_ids(0, t);
  Array types = in.token_type_ids.defined() ? in.token_type_ids : Array::zeros(Shape{b, t}, DType::i64);
  Array x = add(add(embedding(p["bert.embeddings.word_embeddings.weight"], in.input_ids, c.pad_token_id),
                    embedding(p["bert.embeddings.token_type_embeddings.weight"], types)),
                embedding(p["bert.embeddings.position_embeddings.weight"], positions));
  x = layer_norm(x, p["bert.embeddings.LayerNorm.weight"], p["bert.embeddings.LayerNorm.bias"], c.layer_norm_eps);
  x = dropout(x, c.hidden_dropout_prob, dropout_key.fold_in(0), train);
  Array mask = padding_mask(in.attention_mask, "bert");
  const AdapterContext ac{c.lora, dropout_key.fold_in(path_hash("lora")), train};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = "bert.encoder.layer." + std::to_string(l) + ".";
    const RngKey lk = dropout_key.fold_in(uint64_t(l + 1));
    // Captures by value: a checkpointed block reruns in the backward pass, after this returns.
    auto block = [c, pre, lk, mask, ac, train](const Params& p, Array x) {
      auto lin = [&](const Array& h, const std::string& n) { return adapted_linear(h, p, pre + n, p[pre + n + ".bias"], ac); };
      const int64_t heads = c.num_attention_heads;
      AttentionOptions opt{.causal = c.is_decoder, .scale = 0, .dropout_rate = c.attention_probs_dropout_prob,
                           .dropout_key = lk.fold_in(0), .train = train};
      Array a = projected_attention(lin(x, "attention.self.query"), lin(x, "attention.self.key"),
                                    lin(x, "attention.self.value"), heads, heads, mask, opt);
      a = lin(a, "attention.output.dense");
      x = residual_layer_norm(x, a, p[pre + "attention.output.LayerNorm.weight"],
                              p[pre + "attention.output.LayerNorm.bias"], c.layer_norm_eps, c.hidden_dropout_prob,
                              lk.fold_in(1), train);
      const std::string inter = pre + "intermediate.dense";
      Array m = bias_and_activation(adapted_linear(x, p, inter, Array(), ac), p[inter + ".bias"], c.hidden_act);
      m = lin(m, "output.dense");
      return residual_layer_norm(x, m, p[pre + "output.LayerNorm.weight"], p[pre + "output.LayerNorm.bias"],
                                 c.layer_norm_eps, c.hidden_dropout_prob, lk.fold_in(2), train);
    };
    x = transformer_block(c.remat, p, pre, x, block);
  }
  return x;
}

Array bert_pooler(const Params& p, const Array& hidden) {
  Array first = squeeze(slice(hidden, 1, 0, 1), 1);  // (B, H): the [CLS] position
  return tanh(linear(first, p["bert.pooler.dense.weight"], p["bert.pooler.dense.bias"]));
}

Array bert_mlm_logits(const BertConfig& c, const Params& p, const Array& hidden) {
  Array h = activation(linear(hidden, p["cls.predictions.transform.dense.weight"], p["cls.predictions.transform.dense.bias"]),
                       c.hidden_act);
  h = layer_norm(h, p["cls.predictions.transform.LayerNorm.weight"], p["cls.predictions.transform.LayerNorm.bias"],
                 c.layer_norm_eps);
  // The decoder is tied to the word embeddings; its bias is cls.predictions.bias.
  return add(matmul(h, p["bert.embeddings.word_embeddings.weight"], false, true), p["cls.predictions.bias"]);
}

BertOutputs bert_apply(const BertConfig& c, const Params& p, const BertInputs& in, const RngKey& dropout_key, bool train) {
  BertOutputs out;
  out.last_hidden_state = bert_encoder(c, p, in, dropout_key, train);
  if (c.add_pooling_layer) out.pooled = bert_pooler(p, out.last_hidden_state);
  if (c.head == BertHead::sequence_classification) {
    Array h = dropout(out.pooled, c.classifier_dropout_rate(), dropout_key.fold_in(uint64_t(c.num_hidden_layers + 1)),
                      train);
    out.logits = linear(h, p["classifier.weight"], p["classifier.bias"]);
  } else if (c.head == BertHead::masked_lm) {
    out.logits = bert_mlm_logits(c, p, out.last_hidden_state);
  }
  return out;
}

ModelSpec bert_model_spec() {
  ModelSpec s;
  s.model_type = "bert";
  s.kind = ModelKind::encoder;
  s.display_name = "BERT";
  s.lora_targets = R"(encoder\.layer\.\d+\.(attention\.self\.(query|key|value)|attention\.output\.dense|intermediate\.dense|output\.dense)$)";
  s.base_prefix = "bert.";
  s.parse_config = [](const nlohmann::json& j, const PretrainedOptions& o) -> ModelConfig {
    BertConfig c = BertConfig::from_json(j);
    override_class_labels(c.num_labels, c.label_names, o.num_labels, o.label_names);
    if (o.bert_head) c = c.with_head(*o.bert_head);
    c.validate();
    return c;
  };
  s.config_json = [](const ModelConfig& c) { return c.as<BertConfig>().to_json(); };
  s.architecture = [](const ModelConfig& c) -> std::string { return bert_architecture(c.as<BertConfig>().head); };
  s.param_defs = [](const ModelConfig& c) { return bert_param_defs(c.as<BertConfig>()); };
  s.ignored_keys = [](const ModelConfig&) {
    return std::vector<std::string>{R"(cls\.predictions\.decoder\.(weight|bias))", R"((bert\.)?embeddings\.position_ids)"};
  };
  // The masked-LM decoder is the word embedding, and its bias cls.predictions.bias.
  s.tied_keys = [](const ModelConfig&) {
    return std::vector<std::pair<std::string, std::string>>{
        {"bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"},
        {"cls.predictions.bias", "cls.predictions.decoder.bias"}};
  };
  s.head_keys = [](const ModelConfig&) {
    return std::vector<std::string>{R"(classifier\..*)", R"(bert\.pooler\..*)"};
  };
  return s;
}

}  // namespace mt::models
