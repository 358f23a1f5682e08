#pragma once
// What each model parameter is, for the automatic sharding rules (DESIGN.md §4, rule 5):
// the rules split weights by role and by the declared input/output feature dimensions,
// never by guessing from shapes or names.
#include <map>
#include <string>

namespace mt::models {

enum class ParamKind {
  embedding,      // (rows, features) lookup table: rows are indexed by ids
  attention_qkv,  // query/key/value projections (possibly fused, as GPT-2's c_attn)
  attention_out,  // attention output projection
  mlp_in,         // MLP up/gate/in projections
  mlp_out,        // MLP down/out projection
  lm_head,        // projection to the vocabulary
  position_bias,  // per-head attention score bias table (T5's relative buckets [buckets, heads]): split by heads
  input_projection,  // the model's raw input into its residual stream (ViT's patch embedding): row-parallel, so
                     // the stream starts whole after one all-reduce, not split on features before every norm
  dense,          // any other matrix (pooler, classifier, MLM transform, ...)
  norm,           // LayerNorm / RMSNorm scales and shifts
  bias,           // biases of dense layers
  lora_a,         // LoRA down-projection A [r, in]: laid out like its base weight's input features
  lora_b,         // LoRA up-projection B [out..., r]: laid out like its base weight's outputs
  other,
};

// in_dim / out_dim: which dimension of the stored array holds input and output features
// (-1 when not a matrix). nn.Linear stores [out, in] (out_dim 0, in_dim 1); HF GPT-2's
// Conv1D stores [in, out] (in_dim 0, out_dim 1); an embedding stores [rows, features]
// (in_dim 0: the id dimension, out_dim 1).
struct ParamRole {
  ParamKind kind = ParamKind::other;
  int in_dim = -1;
  int out_dim = -1;
};

const char* param_kind_name(ParamKind kind);

using ParamRoles = std::map<std::string, ParamRole>;

}  // namespace mt::models
