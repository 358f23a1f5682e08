#pragma once
// ViT (Dosovitskiy et al.) with Hugging Face's parameter names (ViTModel,
// ViTForImageClassification):
//   vit.embeddings.cls_token (1, 1, D), vit.embeddings.position_embeddings (1, N + 1, D),
//   vit.embeddings.patch_embeddings.projection.{weight,bias}     (a Conv2d (D, C, P, P) with
//       stride P in the files; kept as the Linear (D, C·P·P) it is over flattened patches),
//   vit.encoder.layer.L.attention.attention.{query,key,value}.{weight,bias},
//   vit.encoder.layer.L.attention.output.dense.{weight,bias},
//   vit.encoder.layer.L.intermediate.dense.{weight,bias}, vit.encoder.layer.L.output.dense.{weight,bias},
//   vit.encoder.layer.L.{layernorm_before,layernorm_after}.{weight,bias}, vit.layernorm.{weight,bias},
//   vit.pooler.dense.{weight,bias}                  (ViTModel's pooler),
//   classifier.{weight,bias}                        (image classification, on the [CLS] state).
// Pre-norm blocks: x + attention(LN(x)), then x + MLP(LN(x)); the final LayerNorm follows them.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/models/common.h"
#include "meshtrain/models/lora_options.h"

namespace mt::models {

enum class VitHead {
  none,                  // ViTModel: encoder + final LayerNorm (+ pooler)
  image_classification,  // ViTForImageClassification: encoder + LayerNorm + classifier, no pooler
};

struct VitConfig {
  LoraOptions lora{};
  Remat remat = Remat::none;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  std::string hidden_act = "gelu";
  double hidden_dropout_prob = 0.0;
  double attention_probs_dropout_prob = 0.0;
  double initializer_range = 0.02;
  double layer_norm_eps = 1e-12;
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t num_channels = 3;
  bool qkv_bias = true;
  int64_t num_labels = 2;
  std::vector<std::string> label_names;
  VitHead head = VitHead::none;
  bool add_pooling_layer = true;

  int64_t patches_per_side() const { return image_size / patch_size; }
  int64_t num_patches() const { return patches_per_side() * patches_per_side(); }
  int64_t patch_features() const { return num_channels * patch_size * patch_size; }

  // Required: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size;
  // image_size, patch_size and num_channels default to ViT-Base/16's; the head comes from
  // architectures[0].
  static VitConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  void validate() const;
  VitConfig with_head(VitHead h) const;
};

const char* vit_architecture(VitHead head);
// `prefix`: where the ViTModel's parameters live ("vit." in HF's ViT classes, "encoder." in a
// VisionEncoderDecoderModel).
std::vector<ParamDef> vit_param_defs(const VitConfig& c, const std::string& prefix = "vit.");
Params vit_init(const VitConfig& c, const RngKey& key, DType dtype = DType::f32);

struct VitOutputs {
  Array last_hidden_state;  // (B, N + 1, D), after the final LayerNorm
  Array pooled;             // (B, D) with the pooler, else undefined
  Array logits;             // (B, num_labels) for image classification, else undefined
};

// pixel_values (B, C, image_size, image_size) f32 (data/image_processor.h). Dropout only in
// training.
VitOutputs vit_apply(const VitConfig& c, const Params& p, const Array& pixel_values, const RngKey& dropout_key = {},
                     bool train = false);
// The encoder's output (after the final LayerNorm): what a decoder cross-attends to.
Array vit_encoder(const VitConfig& c, const Params& p, const Array& pixel_values, const RngKey& dropout_key = {},
                  bool train = false, const std::string& prefix = "vit.");
// (B, C, H, W) -> (B, N, C·P·P): each P x P patch's values in the Conv2d weight's (C, P, P) order,
// patches row by row.
Array image_patches(const Array& pixel_values, int64_t patch_size);

}  // namespace mt::models
