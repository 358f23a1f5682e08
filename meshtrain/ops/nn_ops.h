#pragma once
#include <vector>

#include "meshtrain/core/array.h"

namespace mt {

// Softmax / log-softmax along `axis` (negative counts from the end). Max-shifted and
// computed in f32 for bf16/f16 inputs; the output has the input's dtype.
Array softmax(const Array& x, int axis = -1);
Array log_softmax(const Array& x, int axis = -1);

// Layer norm over the last dim: (x - mean) / sqrt(var + eps) * weight + bias, with the
// biased variance (as torch.nn.LayerNorm). weight and bias are (C,) or undefined Arrays
// (no scale / no shift). Mixed precision is supported: weight/bias (one shared dtype) may
// differ from x's dtype (e.g. f32 params, bf16 activations); statistics are f32, the
// output has x's dtype and each gradient its input's dtype.
Array layer_norm(const Array& x, const Array& weight, const Array& bias, double eps = 1e-5);

// RMS norm over the last dim, LLaMA style: x * rsqrt(mean(x^2) + eps) * weight, computed
// in f32 and rounded once to x's dtype. weight is (C,) or undefined; its dtype may differ
// from x's as for layer_norm.
Array rms_norm(const Array& x, const Array& weight, double eps = 1e-6);

// The norms' argument checks (`op` names the caller in the errors): a floating x with a
// non-empty last dim, weight/bias (C,) floating of one dtype when defined, eps finite >= 0.
void check_norm_arguments(const char* op, const Array& x, const Array& weight, const Array& bias, double eps);

// The norms' VJP written with ops in f32 (differentiable again; the reference of the fused
// kernels): {dx, dweight, dbias}, undefined where the parameter is. `center` is layer norm.
std::vector<Array> norm_vjp(bool center, const Array& x, const Array& weight, const Array& bias, double eps,
                            const Array& g);

}  // namespace mt
