#pragma once
// The dense layers in both storage conventions (nn.Linear [out, in], HF Conv1D [in, out]),
// Hugging Face's activations, head splitting, and the transformer block wrapper that
// recomputes a block in the backward pass under --remat.
#include <array>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/autodiff/remat.h"
#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/ops/attention.h"

namespace mt::models {

// nn.Linear: x @ weightᵀ + bias with weight [out, in]; bias may be undefined.
Array linear(const Array& x, const Array& weight, const Array& bias = Array());
// HF Conv1D: x @ weight + bias with weight [in, out].
Array conv1d(const Array& x, const Array& weight, const Array& bias);
// Hugging Face activation names: gelu (erf), gelu_new / gelu_pytorch_tanh (tanh), relu,
// silu / swish, tanh.
Array activation(const Array& x, const std::string& name);
void check_activation(const std::string& name, const char* what);

// The block steps the fused ops (ops/fused_ops.h) replace, fused when fused_layers() is on
// (the default) and composed otherwise:
// activation(y + bias), fused for relu and the GeLUs (y being a linear layer's output
// without its bias);
Array bias_and_activation(const Array& y, const Array& bias, const std::string& activation_name);
// x + dropout(branch), the pre-norm block's residual step;
Array residual_add(const Array& x, const Array& branch, double rate, const RngKey& key, bool train);
// layer_norm(x + dropout(branch)), the post-norm block's residual step.
Array residual_layer_norm(const Array& x, const Array& branch, const Array& weight, const Array& bias, double eps,
                          double rate, const RngKey& key, bool train);
// Attention over a block's projections: q (B, Tq, H·D), k (B, Tk, Hkv·D), v (B, Tk, Hkv·Dv) to
// (B, Tq, H·Dv), the values merge_heads(scaled_dot_product_attention(split_heads(q, H),
// split_heads(k, Hkv), split_heads(v, Hkv), mask, options)) has. With fused_layers() on (the
// default) the heads are split by reshapes only and the fused kernels read them in place
// (attention_heads_inner): no head transposes in either pass.
Array projected_attention(const Array& q, const Array& k, const Array& v, int64_t heads, int64_t kv_heads,
                          const Array& mask, const AttentionOptions& options);
// Self-attention over one fused q | k | v projection: qkv (B, T, (H + 2·Hkv)·D) to (B, T, H·D),
// the values projected_attention has over its three slices. With fused_layers() on, the fused
// kernel reads the three in place and hands back the projection's gradient whole
// (attention_packed); otherwise the slices take projected_attention.
Array packed_projected_attention(const Array& qkv, int64_t heads, int64_t kv_heads, const Array& mask,
                                 const AttentionOptions& options);
// The head dim of such a projection (checked), and its q, k and v slices (B, T, H·D),
// (B, T, Hkv·D), (B, T, Hkv·D).
int64_t packed_head_dim(const Array& qkv, int64_t heads, int64_t kv_heads);
std::array<Array, 3> split_packed_projection(const Array& qkv, int64_t heads, int64_t kv_heads);
// (B, T, H*D) -> (B, H, T, D) and back.
Array split_heads(const Array& x, int64_t heads);
Array merge_heads(const Array& x);

// One transformer block, x -> body(bp, x), where bp holds the parameters whose paths start
// with `prefix` (the block's weights and their adapters). With remat != none the block keeps
// only x for the backward pass and is rerun there (mt::checkpoint), so body must read its
// weights from bp, not from the whole tree.
using BlockFn = std::function<Array(const Params& bp, const Array& x)>;
Array transformer_block(Remat remat, const Params& p, const std::string& prefix, const Array& x, const BlockFn& body);
// The same for a block that reads more traced arrays than its input (an encoder's output for
// cross-attention, a position bias computed from parameters outside the block): all of them
// come in through `inputs`, inputs[0] being the residual stream.
using MultiInputBlockFn = std::function<Array(const Params& bp, const std::vector<Array>& inputs)>;
Array transformer_block(Remat remat, const Params& p, const std::string& prefix, const std::vector<Array>& inputs,
                        const MultiInputBlockFn& body);

}  // namespace mt::models
