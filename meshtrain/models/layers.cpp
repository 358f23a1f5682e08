#include "meshtrain/models/layers.h"

#include <cmath>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/fused_ops.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/linear.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/nn_ops.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

// The bias rides in the product's epilogue (ops/linear.h) unless the composed reference is
// asked for or the arrays are distributed (the sharding rules are matmul's and add's).
Array linear(const Array& x, const Array& weight, const Array& bias) {
  if (fused_layers() && linear_bias_applies(x, weight, bias, true)) return linear_bias(x, weight, bias, true);
  Array y = matmul(x, weight, false, true);
  return bias.defined() ? add(y, bias) : y;
}

Array conv1d(const Array& x, const Array& weight, const Array& bias) {
  if (fused_layers() && linear_bias_applies(x, weight, bias, false)) return linear_bias(x, weight, bias, false);
  Array y = matmul(x, weight);
  return bias.defined() ? add(y, bias) : y;
}

void check_activation(const std::string& name, const char* what) {
  static const char* known[] = {"gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh"};
  for (const char* k : known)
    if (name == k) return;
  throw Error(detail::concat("[", what, "] unsupported activation '", name,
                             "' (supported: gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish, tanh)"));
}

Array activation(const Array& x, const std::string& name) {
  if (name == "gelu") return gelu(x, false);
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return gelu(x, true);
  if (name == "relu") return relu(x);
  if (name == "silu" || name == "swish") return silu(x);
  if (name == "tanh") return tanh(x);
  check_activation(name, "activation");
  return x;
}

Array bias_and_activation(const Array& y, const Array& bias, const std::string& name) {
  if (!bias.defined()) return activation(y, name);
  if (fused_layers()) {
    if (name == "gelu") return mt::bias_activation(y, bias, FusedActivation::gelu);
    if (name == "gelu_new" || name == "gelu_pytorch_tanh") return mt::bias_activation(y, bias, FusedActivation::gelu_tanh);
    if (name == "relu") return mt::bias_activation(y, bias, FusedActivation::relu);
  }
  return activation(add(y, bias), name);
}

Array residual_add(const Array& x, const Array& branch, double rate, const RngKey& key, bool train) {
  if (fused_layers() && train && rate > 0) return add_dropout(x, branch, rate, key, train);
  return add(x, dropout(branch, rate, key, train));
}

Array residual_layer_norm(const Array& x, const Array& branch, const Array& weight, const Array& bias, double eps,
                          double rate, const RngKey& key, bool train) {
  if (fused_layers()) return add_dropout_layer_norm(x, branch, weight, bias, eps, rate, key, train);
  return layer_norm(add(x, dropout(branch, rate, key, train)), weight, bias, eps);
}

Array split_heads(const Array& x, int64_t heads) {
  MT_CHECK(x.ndim() == 3 && x.dim(2) % heads == 0, "[split_heads] expects (B, T, H*D) with H = ", heads, ", got ",
           x.str());
  return swap_axes(reshape(x, {x.dim(0), x.dim(1), heads, x.dim(2) / heads}), 1, 2);
}

Array projected_attention(const Array& q, const Array& k, const Array& v, int64_t heads, int64_t kv_heads,
                          const Array& mask, const AttentionOptions& options) {
  if (!fused_layers())
    return merge_heads(scaled_dot_product_attention(split_heads(q, heads), split_heads(k, kv_heads),
                                                    split_heads(v, kv_heads), mask, options));
  auto heads_inner = [](const Array& x, int64_t h) {
    MT_CHECK(x.ndim() == 3 && h > 0 && x.dim(2) % h == 0, "[attention] expects (B, T, H*D) projections with H = ", h,
             ", got ", x.str());
    return reshape(x, {x.dim(0), x.dim(1), h, x.dim(2) / h});
  };
  const Array out = attention_heads_inner(heads_inner(q, heads), heads_inner(k, kv_heads), heads_inner(v, kv_heads),
                                          mask, options);
  return reshape(out, {out.dim(0), out.dim(1), out.dim(2) * out.dim(3)});
}

int64_t packed_head_dim(const Array& qkv, int64_t heads, int64_t kv_heads) {
  MT_CHECK(qkv.ndim() == 3 && heads > 0 && kv_heads > 0 && qkv.dim(2) % (heads + 2 * kv_heads) == 0,
           "[attention] expects a (B, T, (H + 2·Hkv)·D) q | k | v projection with H = ", heads, " and Hkv = ", kv_heads,
           ", got ", qkv.str());
  return qkv.dim(2) / (heads + 2 * kv_heads);
}

std::array<Array, 3> split_packed_projection(const Array& qkv, int64_t heads, int64_t kv_heads) {
  const int64_t d = packed_head_dim(qkv, heads, kv_heads);
  return {slice(qkv, 2, 0, heads * d), slice(qkv, 2, heads * d, (heads + kv_heads) * d),
          slice(qkv, 2, (heads + kv_heads) * d, qkv.dim(2))};
}

Array packed_projected_attention(const Array& qkv, int64_t heads, int64_t kv_heads, const Array& mask,
                                 const AttentionOptions& options) {
  const int64_t d = packed_head_dim(qkv, heads, kv_heads);
  if (!fused_layers()) {
    const auto [q, k, v] = split_packed_projection(qkv, heads, kv_heads);
    return projected_attention(q, k, v, heads, kv_heads, mask, options);
  }
  const Array out = attention_packed(reshape(qkv, {qkv.dim(0), qkv.dim(1), heads + 2 * kv_heads, d}), heads,
                                     kv_heads, mask, options);
  return reshape(out, {out.dim(0), out.dim(1), out.dim(2) * out.dim(3)});
}

Array merge_heads(const Array& x) {
  MT_CHECK(x.ndim() == 4, "[merge_heads] expects (B, H, T, D), got ", x.str());
  return reshape(swap_axes(x, 1, 2), {x.dim(0), x.dim(2), x.dim(1) * x.dim(3)});
}

Array transformer_block(Remat remat, const Params& p, const std::string& prefix, const Array& x, const BlockFn& body) {
  if (remat == Remat::none) return body(p, x);
  return checkpoint([body](const Params& bp, const std::vector<Array>& xs) { return body(bp, xs[0]); },
                    p.with_prefix(prefix), {x});
}

Array transformer_block(Remat remat, const Params& p, const std::string& prefix, const std::vector<Array>& inputs,
                        const MultiInputBlockFn& body) {
  if (remat == Remat::none) return body(p, inputs);
  // Undefined inputs (no mask, no bias) stay out of the checkpoint's traced inputs.
  std::vector<Array> defined;
  std::vector<int> where;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined()) where.push_back(int(i)), defined.push_back(inputs[i]);
  const size_t n = inputs.size();
  return checkpoint(
      [body, where, n](const Params& bp, const std::vector<Array>& xs) {
        std::vector<Array> all(n);
        for (size_t i = 0; i < where.size(); ++i) all[size_t(where[i])] = xs[i];
        return body(bp, all);
      },
      p.with_prefix(prefix), defined);
}

}  // namespace mt::models
