#pragma once
// LoRA (Hu et al., as Hugging Face PEFT implements it) over any model of the registry: a
// dense layer W whose module matches the targets gets y = W x + s · B (A (dropout(x))),
// s = alpha / r (or alpha / sqrt(r) with rsLoRA), A [r, in] Kaiming-uniform and B [out, r]
// zero at init, so the adapted model starts exactly at the base model.
//
// Adapters live in the same Params as the model: "<module>.lora_A.weight" and
// "<module>.lora_B.weight" (PEFT's names without its "base_model.model." prefix). The
// model's config carries the LoraOptions (ModelConfig::lora), its forward functions call
// adapted_linear / adapted_conv1d, and the sharding rules lay A out like the base weight's
// input features and B like its output features, so tensor parallelism and FSDP apply.
// GPT-2's fused c_attn [in, 3, out] gets B [3, out, r] (PEFT's [3·out, r] in files).
#include <string>
#include <vector>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/models/common.h"
#include "meshtrain/models/lora_options.h"

namespace mt::models {

// A dense layer LoRA can adapt: "<path>.weight" is a matrix (or GPT-2's [in, 3, out]).
struct LoraModule {
  std::string path;  // "model.layers.0.self_attn.q_proj"
  Shape weight_shape;
  ParamRole role;    // the weight's
  int64_t in = 0;    // input features
  int64_t out = 0;   // output features (all groups together: 3·out for c_attn)
};

std::string lora_a_path(const std::string& module);  // "<module>.lora_A.weight"
std::string lora_b_path(const std::string& module);  // "<module>.lora_B.weight"
// True for an adapter parameter's path.
bool is_lora_path(const std::string& path);
// "<module>.weight" for an adapter path (the weight it adapts).
std::string lora_base_weight_path(const std::string& adapter_path);

// Every dense layer of a model's parameter table (attention, MLP, other dense layers and
// the LM head; not embeddings, norms or biases).
std::vector<LoraModule> lora_candidates(const std::vector<ParamDef>& base_defs);
// The modules `options` adapts: options.targets (or `default_targets` when empty) searched in
// each candidate's path. Throws mt::Error for an invalid regex, a regex that matches no dense
// layer (listing some that exist), or a rank <= 0 or above a target's smaller dimension.
std::vector<LoraModule> lora_targets(const std::vector<ParamDef>& base_defs, const LoraOptions& options,
                                     const std::string& default_targets);
// The adapters' table: A (Kaiming-uniform) and B (zeros) per target, roles lora_a / lora_b.
std::vector<ParamDef> lora_param_defs(const std::vector<ParamDef>& base_defs, const LoraOptions& options,
                                      const std::string& default_targets);

// What a forward pass needs to apply adapters: the options and the dropout key and mode.
struct AdapterContext {
  LoraOptions lora{};
  RngKey dropout_key{0, 0};
  bool train = false;
};

// A(dropout(x)) of `module` (..., r), or an undefined Array when p holds no adapter for it.
Array lora_down(const Array& x, const Params& p, const std::string& module, const AdapterContext& ctx);
// s · down Bᵀ with B [out, r] (one group of a grouped B, already sliced).
Array lora_up(const Array& down, const Array& b, const AdapterContext& ctx);
// nn.Linear (weight [out, in]) and HF Conv1D (weight [in, out]) plus the module's adapter
// when p holds one.
Array adapted_linear(const Array& x, const Params& p, const std::string& module, const Array& bias,
                     const AdapterContext& ctx);
Array adapted_conv1d(const Array& x, const Params& p, const std::string& module, const Array& bias,
                     const AdapterContext& ctx);

// s · B A in the layout of the module's weight (transposed for Conv1D, [in, 3, out] for
// c_attn), in f32.
Array lora_delta_weight(const Array& a, const Array& b, const ParamRole& weight_role, const Shape& weight_shape,
                        const LoraOptions& options);
// The base parameters with every adapter folded into its weight (W + s·B A) and the adapter
// entries removed: a plain model again.
Params merge_lora(const Params& params, const std::vector<ParamDef>& base_defs, const LoraOptions& options);
// The inverse on weights merged earlier: W - s·B A, with the adapters kept.
Params unmerge_lora(const Params& merged_with_adapters, const std::vector<ParamDef>& base_defs,
                    const LoraOptions& options);

}  // namespace mt::models
