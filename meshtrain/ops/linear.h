#pragma once
// A linear layer's product and bias as one primitive: x · op(w) + bias with the bias added in
// the GEMM's epilogue on a GPU (cuBLASLt), so the output is written once instead of written,
// read and written again by a separate add (and one launch fewer per layer). The composed
// matmul + add stays the reference and the path for distributed arrays.
#include "meshtrain/core/array.h"

namespace mt {

// x (..., K) times w (K, N), or w (N, K) read transposed when trans_w (nn.Linear's layout),
// plus bias (N,): (..., N). x, w and bias share a floating dtype; f32 products follow the
// matmul precision in force (ops/matmul.h), as matmul does. The rows of x fold into one GEMM.
// In f32 on the CPU it equals matmul followed by add bit for bit, gradients included (the
// bias gradient is add's: g summed over the rows).
Array linear_bias(const Array& x, const Array& w, const Array& bias, bool trans_w);

// Whether linear_bias takes these arrays (the models fall back to matmul + add otherwise):
// defined, one floating dtype, w 2-D, bias (N,), x of rank >= 1 with K features, none
// distributed.
bool linear_bias_applies(const Array& x, const Array& w, const Array& bias, bool trans_w);

}  // namespace mt
