#pragma once
// Fused forms of the op chains every transformer block repeats: the linear layer's epilogue
// (bias + activation), the residual add of a dropped branch, and the post-norm block's
// norm(x + dropout(branch)). Each is one pass forward and one pass backward where the composed
// ops take two or three, with the same rounding as the composed ops (f32 results equal them
// bit for bit); the composed forms stay the reference and the nested-gradient path.
#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"

namespace mt {

// The activations the linear epilogue fuses.
enum class FusedActivation { relu, gelu, gelu_tanh };

// act(y + bias) with bias (C,) along y's last dim (another float dtype allowed, as f32 biases
// on bf16 activations): the pre-activation is not stored (the backward forms it again from y
// and bias), and the bias gradient comes out of the same pass as y's.
Array bias_activation(const Array& y, const Array& bias, FusedActivation act);

// x + dropout(branch, rate, key): x and branch of one shape and dtype; the mask is dropout()'s
// for the same key (drawn at the branch's positions), so the result equals the composed ops.
Array add_dropout(const Array& x, const Array& branch, double rate, const RngKey& key, bool train = true);

// layer_norm(x + dropout(branch)) / rms_norm(x + dropout(branch)) in one pass: the post-norm
// block's residual step (BERT, BART). Keeps only the sum and the row statistics for the
// backward, which writes both inputs' gradients and the weight and bias gradients in one pass.
Array add_dropout_layer_norm(const Array& x, const Array& branch, const Array& weight, const Array& bias, double eps,
                             double rate, const RngKey& key, bool train = true);
Array add_dropout_rms_norm(const Array& x, const Array& branch, const Array& weight, double eps, double rate,
                           const RngKey& key, bool train = true);

// Whether the models build their blocks from these fused ops (the default) or from the
// composed ops they replace (the reference, for comparisons and benchmarks). Process-wide;
// MT_FUSED_LAYERS=0 in the environment starts with them off.
void set_fused_layers(bool on);
bool fused_layers();

}  // namespace mt
