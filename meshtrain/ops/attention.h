#pragma once
#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"

namespace mt {

struct AttentionOptions {
  // Lower-triangular mask aligned to the end: query i (of Tq) sees keys j <= i + Tk - Tq,
  // which is also right for a KV cache holding earlier positions.
  bool causal = false;
  double scale = 0;  // 0 means 1/sqrt(head_dim)
  double dropout_rate = 0;  // on the attention probabilities, in training only
  RngKey dropout_key{};
  bool train = false;
  // Added to the scaled scores before the mask (T5's relative position bias), float and
  // broadcastable to (B, H, Tq, Tk); undefined = none.
  Array bias{};
};

// softmax(scale · q kᵀ) v, fused (flash-style): q (B, H, Tq, D), k and v (B, H, Tk, D) (heads
// already repeated), bottom-right causal mask when `causal`, dropout on the probabilities at
// `dropout_rate` (0: none) with the masks dropout() would draw on the (B, H, Tq, Tk) array.
// The probabilities are never stored. key_mask: an optional bool key-padding mask (B or 1,
// 1, 1, Tk), true = attend, masked scores set to the lowest finite value as the composed
// form's where() does (on a GPU: f32 or bf16 arrays, head dim <= 128, sm_80+).
Array flash_attention(const Array& q, const Array& k, const Array& v, double scale, bool causal,
                      double dropout_rate = 0.0, const RngKey& dropout_key = {}, const Array& key_mask = Array());

// Whether `mask` is a key-padding mask flash_attention takes for queries of batch `batch`
// and Tk keys: bool (B or 1, 1, 1, Tk).
bool is_key_padding_mask(const Array& mask, int64_t batch, int64_t tk);

// Which form scaled_dot_product_attention runs for causal attention without a mask or bias,
// and for non-causal attention with at most a key-padding mask (BERT's):
// `composed` (GEMMs, the fused causal softmax, dropout, with the (Tq, Tk) probabilities kept
// for the backward), `fused` (flash_attention: none kept), or `automatic` (the default):
// on the CPU fused under every precision (its blocks of rows run on oneDNN's GEMMs, f32 or
// bf16, and keep no T x T arrays); on a GPU fused where the tensor-core kernels take the
// arrays (f32 or bf16, head dim <= 128, sm_80+), else composed.
// Process-wide.
enum class AttentionKernel { automatic, composed, fused };
void set_attention_kernel(AttentionKernel kernel);
AttentionKernel attention_kernel();
AttentionKernel attention_kernel_from_name(const std::string& name);  // "auto" | "composed" | "fused"

// softmax(q kᵀ · scale + bias + mask) v over heads.
// q: (B, H, Tq, D); k: (B, Hkv, Tk, D); v: (B, Hkv, Tk, Dv) with H a multiple of Hkv
// (grouped-query attention). mask: bool, broadcastable to (B, H, Tq, Tk), true = attend
// (e.g. a padding mask of shape (B, 1, 1, Tk)); undefined = no mask. Masked scores get the
// lowest finite value, so a fully masked row attends uniformly instead of producing NaN.
Array scaled_dot_product_attention(const Array& q, const Array& k, const Array& v, const Array& mask = Array(),
                                   const AttentionOptions& options = {});

// scaled_dot_product_attention over heads-inner arrays: q (B, Tq, H, D), k (B, Tk, Hkv, D),
// v (B, Tk, Hkv, Dv) — (B, T, H·D) projections reshaped, with no transposes — to
// (B, Tq, H, Dv), which reshapes to (B, Tq, H·Dv) for the output projection. Where
// scaled_dot_product_attention would run the fused kernel (and, on a GPU, its tensor-core
// kernels take the arrays), the kernel reads and writes this layout itself, so neither pass
// moves the heads; elsewhere the heads are transposed around scaled_dot_product_attention. The
// same values, masks, dropout and gradients as the (B, H, T, D) form.
Array attention_heads_inner(const Array& q, const Array& k, const Array& v, const Array& mask = Array(),
                            const AttentionOptions& options = {});

// flash_attention over heads-inner arrays (the primitive attention_heads_inner runs): q
// (B, Tq, H, D), k and v (B, Tk, Hkv, D), out (B, Tq, H, D).
Array flash_attention_heads_inner(const Array& q, const Array& k, const Array& v, double scale, bool causal,
                                  double dropout_rate = 0.0, const RngKey& dropout_key = {},
                                  const Array& key_mask = Array());

// attention_heads_inner over the packed output of one fused q | k | v projection: qkv (B, T,
// H + 2·Hkv, D) — q's H heads, then k's and v's Hkv each, as a (B, T, (H + 2·Hkv)·D) product
// reshapes — self-attention to (B, T, H, D). Where the fused kernel runs, it reads q, k and v
// in place and writes their gradient as one packed array (no slices, no concatenation, one
// GEMM's worth of gradient for the projection); elsewhere the three are sliced out for
// attention_heads_inner. The same values, masks, dropout and gradients.
Array attention_packed(const Array& qkv, int64_t heads, int64_t kv_heads, const Array& mask = Array(),
                       const AttentionOptions& options = {});

// flash_attention over a packed (B, T, H + 2·Hkv, D) q | k | v (the primitive attention_packed
// runs): out (B, T, H, D); the gradient comes back packed.
Array flash_attention_packed(const Array& qkv, int64_t heads, int64_t kv_heads, double scale, bool causal,
                             double dropout_rate = 0.0, const RngKey& dropout_key = {},
                             const Array& key_mask = Array());

// Bool (Tq, Tk) mask of causal attention with keys offset by Tk - Tq.
Array causal_mask(int64_t tq, int64_t tk);

// softmax(scale · scores) over the last axis with a causal mask on the last two axes
// (..., Tq, Tk): query i sees keys j <= i + Tk − Tq. One fused pass; the VJP is written with
// ops, so it nests (second-order gradients).
Array causal_softmax(const Array& scores, double scale);

}  // namespace mt
