#include "meshtrain/models/vit.h"

#include "meshtrain/models/class_labels.h"
#include "meshtrain/models/lora.h"
#include "meshtrain/models/model_spec.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/nn_ops.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

const char* vit_architecture(VitHead head) {
  return head == VitHead::image_classification ? "ViTForImageClassification" : "ViTModel";
}

VitConfig VitConfig::with_head(VitHead h) const {
  VitConfig c = *this;
  c.head = h;
  // HF's ViTForImageClassification builds its ViTModel without the pooler.
  c.add_pooling_layer = h == VitHead::none;
  return c;
}

VitConfig VitConfig::from_json(const nlohmann::json& j) {
  const char* w = "vit config";
  VitConfig c;
  c.hidden_size = config_get<int64_t>(j, "hidden_size", w);
  c.num_hidden_layers = config_get<int64_t>(j, "num_hidden_layers", w);
  c.num_attention_heads = config_get<int64_t>(j, "num_attention_heads", w);
  c.intermediate_size = config_get<int64_t>(j, "intermediate_size", w);
  c.hidden_act = config_get<std::string>(j, "hidden_act", w, "gelu");
  c.hidden_dropout_prob = config_get<double>(j, "hidden_dropout_prob", w, 0.0);
  c.attention_probs_dropout_prob = config_get<double>(j, "attention_probs_dropout_prob", w, 0.0);
  c.initializer_range = config_get<double>(j, "initializer_range", w, 0.02);
  c.layer_norm_eps = config_get<double>(j, "layer_norm_eps", w, 1e-12);
  c.image_size = config_get<int64_t>(j, "image_size", w, 224);
  c.patch_size = config_get<int64_t>(j, "patch_size", w, 16);
  c.num_channels = config_get<int64_t>(j, "num_channels", w, 3);
  c.qkv_bias = config_get<bool>(j, "qkv_bias", w, true);
  ClassLabels labels = read_class_labels(j, w);
  c.num_labels = labels.num_labels;
  c.label_names = std::move(labels.names);
  std::string arch = "ViTModel";
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty())
    arch = j["architectures"][0].get<std::string>();
  c = c.with_head(arch == "ViTForImageClassification" ? VitHead::image_classification : VitHead::none);
  c.validate();
  return c;
}

nlohmann::json VitConfig::to_json() const {
  nlohmann::json j = {{"model_type", "vit"},
                      {"architectures", {vit_architecture(head)}},
                      {"hidden_size", hidden_size},
                      {"num_hidden_layers", num_hidden_layers},
                      {"num_attention_heads", num_attention_heads},
                      {"intermediate_size", intermediate_size},
                      {"hidden_act", hidden_act},
                      {"hidden_dropout_prob", hidden_dropout_prob},
                      {"attention_probs_dropout_prob", attention_probs_dropout_prob},
                      {"initializer_range", initializer_range},
                      {"layer_norm_eps", layer_norm_eps},
                      {"image_size", image_size},
                      {"patch_size", patch_size},
                      {"num_channels", num_channels},
                      {"qkv_bias", qkv_bias},
                      {"encoder_stride", patch_size}};
  write_class_labels(j, num_labels, label_names);
  return j;
}

void VitConfig::validate() const {
  MT_CHECK(hidden_size > 0 && num_hidden_layers > 0 && num_attention_heads > 0 && intermediate_size > 0 &&
               image_size > 0 && patch_size > 0 && num_channels > 0,
           "[vit config] sizes must be positive: hidden_size ", hidden_size, ", num_hidden_layers ", num_hidden_layers,
           ", num_attention_heads ", num_attention_heads, ", intermediate_size ", intermediate_size, ", image_size ",
           image_size, ", patch_size ", patch_size, ", num_channels ", num_channels);
  MT_CHECK(hidden_size % num_attention_heads == 0, "[vit config] hidden_size ", hidden_size,
           " is not a multiple of num_attention_heads ", num_attention_heads);
  MT_CHECK(image_size % patch_size == 0, "[vit config] image_size ", image_size, " is not a multiple of patch_size ",
           patch_size);
  MT_CHECK(head != VitHead::image_classification || num_labels > 0, "[vit config] num_labels must be positive, got ",
           num_labels);
  check_activation(hidden_act, "vit config");
}

std::vector<ParamDef> vit_param_defs(const VitConfig& c, const std::string& prefix) {
  c.validate();
  const int64_t e = c.hidden_size, f = c.intermediate_size;
  const double std = c.initializer_range;
  std::vector<ParamDef> d;
  auto lin = [&](const std::string& p, int64_t out, int64_t in, ParamKind kind, bool bias = true) {
    d.push_back({p + ".weight", {out, in}, linear_role(kind), InitKind::normal, std});
    if (bias) d.push_back({p + ".bias", {out}, vector_role(ParamKind::bias), InitKind::zeros});
  };
  auto norm = [&](const std::string& p) {
    d.push_back({p + ".weight", {e}, vector_role(ParamKind::norm), InitKind::ones});
    d.push_back({p + ".bias", {e}, vector_role(ParamKind::norm), InitKind::zeros});
  };
  // Added to every position's state: laid out as norms are (replicated).
  d.push_back({prefix + "embeddings.cls_token", {1, 1, e}, vector_role(ParamKind::norm), InitKind::normal, std});
  d.push_back({prefix + "embeddings.position_embeddings", {1, c.num_patches() + 1, e}, vector_role(ParamKind::norm),
               InitKind::normal, std});
  // Row-parallel: its partial output is summed once into the whole residual stream.
  lin(prefix + "embeddings.patch_embeddings.projection", e, c.patch_features(), ParamKind::input_projection);
  d[d.size() - 2].file_shape = Shape{e, c.num_channels, c.patch_size, c.patch_size};  // the Conv2d's
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string b = prefix + "encoder.layer." + std::to_string(l) + ".";
    norm(b + "layernorm_before");
    lin(b + "attention.attention.query", e, e, ParamKind::attention_qkv, c.qkv_bias);
    lin(b + "attention.attention.key", e, e, ParamKind::attention_qkv, c.qkv_bias);
    lin(b + "attention.attention.value", e, e, ParamKind::attention_qkv, c.qkv_bias);
    lin(b + "attention.output.dense", e, e, ParamKind::attention_out);
    norm(b + "layernorm_after");
    lin(b + "intermediate.dense", f, e, ParamKind::mlp_in);
    lin(b + "output.dense", e, f, ParamKind::mlp_out);
  }
  norm(prefix + "layernorm");
  if (c.add_pooling_layer) lin(prefix + "pooler.dense", e, e, ParamKind::dense);
  if (c.head == VitHead::image_classification) lin("classifier", c.num_labels, e, ParamKind::dense);
  return d;
}

Params vit_init(const VitConfig& c, const RngKey& key, DType dtype) { return init_params(vit_param_defs(c), key, dtype); }

Array image_patches(const Array& pixel_values, int64_t patch_size) {
  const int64_t b = pixel_values.dim(0), ch = pixel_values.dim(1), h = pixel_values.dim(2), w = pixel_values.dim(3);
  const int64_t hp = h / patch_size, wp = w / patch_size;
  Array x = reshape(pixel_values, {b, ch, hp, patch_size, wp, patch_size});
  x = transpose(x, {0, 2, 4, 1, 3, 5});  // (B, Hp, Wp, C, P, P)
  return reshape(x, {b, hp * wp, ch * patch_size * patch_size});
}

Array vit_encoder(const VitConfig& c, const Params& p, const Array& pixel_values, const RngKey& dropout_key, bool train,
                  const std::string& prefix) {
  c.validate();
  MT_CHECK(pixel_values.defined() && pixel_values.ndim() == 4 && is_floating(pixel_values.dtype()),
           "[vit] pixel_values must be floating (B, C, H, W), got ",
           pixel_values.defined() ? pixel_values.str() : "undefined");
  MT_CHECK(pixel_values.dim(1) == c.num_channels && pixel_values.dim(2) == c.image_size &&
               pixel_values.dim(3) == c.image_size,
           "[vit] pixel_values ", pixel_values.str(), " must be (B, ", c.num_channels, ", ", c.image_size, ", ",
           c.image_size, ") for this model (num_channels ", c.num_channels, ", image_size ", c.image_size,
           "): resize with the model's preprocessor_config.json");
  const int64_t b = pixel_values.dim(0), e = c.hidden_size;
  const DType dtype = p[prefix + "embeddings.cls_token"].dtype();
  const AdapterContext ac{c.lora, dropout_key.fold_in(path_hash("lora")), train};
  const std::string proj = prefix + "embeddings.patch_embeddings.projection";
  Array patches = adapted_linear(image_patches(cast(pixel_values, dtype), c.patch_size), p, proj, p[proj + ".bias"], ac);
  Array cls = broadcast_to(p[prefix + "embeddings.cls_token"], Shape{b, 1, e});
  Array x = add(concatenate({cls, patches}, 1), p[prefix + "embeddings.position_embeddings"]);
  x = dropout(x, c.hidden_dropout_prob, dropout_key.fold_in(0), train);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = prefix + "encoder.layer." + std::to_string(l) + ".";
    const RngKey lk = dropout_key.fold_in(uint64_t(l + 1));
    // Captures by value: a checkpointed block reruns in the backward pass, after this returns.
    auto block = [c, pre, lk, ac, train](const Params& p, Array x) {
      auto lin = [&](const Array& h, const std::string& n) {
        const std::string m = pre + n;
        return adapted_linear(h, p, m, p.contains(m + ".bias") ? p[m + ".bias"] : Array(), ac);
      };
      Array h = layer_norm(x, p[pre + "layernorm_before.weight"], p[pre + "layernorm_before.bias"], c.layer_norm_eps);
      const int64_t heads = c.num_attention_heads;
      AttentionOptions opt{.causal = false, .scale = 0, .dropout_rate = c.attention_probs_dropout_prob,
                           .dropout_key = lk.fold_in(0), .train = train};
      Array a = projected_attention(lin(h, "attention.attention.query"), lin(h, "attention.attention.key"),
                                    lin(h, "attention.attention.value"), heads, heads, Array(), opt);
      a = lin(a, "attention.output.dense");
      x = residual_add(x, a, c.hidden_dropout_prob, lk.fold_in(1), train);
      h = layer_norm(x, p[pre + "layernorm_after.weight"], p[pre + "layernorm_after.bias"], c.layer_norm_eps);
      const std::string inter = pre + "intermediate.dense";
      Array m = bias_and_activation(adapted_linear(h, p, inter, Array(), ac), p[inter + ".bias"], c.hidden_act);
      return residual_add(x, lin(m, "output.dense"), c.hidden_dropout_prob, lk.fold_in(2), train);
    };
    x = transformer_block(c.remat, p, pre, x, block);
  }
  return layer_norm(x, p[prefix + "layernorm.weight"], p[prefix + "layernorm.bias"], c.layer_norm_eps);
}

VitOutputs vit_apply(const VitConfig& c, const Params& p, const Array& pixel_values, const RngKey& dropout_key,
                     bool train) {
  VitOutputs out;
  out.last_hidden_state = vit_encoder(c, p, pixel_values, dropout_key, train);
  Array first = squeeze(slice(out.last_hidden_state, 1, 0, 1), 1);  // (B, D): the [CLS] state
  if (c.add_pooling_layer) out.pooled = tanh(linear(first, p["vit.pooler.dense.weight"], p["vit.pooler.dense.bias"]));
  if (c.head == VitHead::image_classification) out.logits = linear(first, p["classifier.weight"], p["classifier.bias"]);
  return out;
}

ModelSpec vit_model_spec() {
  ModelSpec s;
  s.model_type = "vit";
  s.kind = ModelKind::vision;
  s.display_name = "ViT";
  s.lora_targets =
      R"(encoder\.layer\.\d+\.(attention\.attention\.(query|key|value)|attention\.output\.dense|intermediate\.dense|output\.dense)$)";
  s.base_prefix = "vit.";
  s.parse_config = [](const nlohmann::json& j, const PretrainedOptions& o) -> ModelConfig {
    VitConfig c = VitConfig::from_json(j);
    override_class_labels(c.num_labels, c.label_names, o.num_labels, o.label_names);
    c.validate();
    return c;
  };
  s.config_json = [](const ModelConfig& c) { return c.as<VitConfig>().to_json(); };
  s.architecture = [](const ModelConfig& c) -> std::string { return vit_architecture(c.as<VitConfig>().head); };
  s.param_defs = [](const ModelConfig& c) { return vit_param_defs(c.as<VitConfig>()); };
  s.head_keys = [](const ModelConfig&) { return std::vector<std::string>{R"(classifier\..*)", R"(vit\.pooler\..*)"}; };
  return s;
}

}  // namespace mt::models
