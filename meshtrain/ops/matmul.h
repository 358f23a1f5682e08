#pragma once
#include "meshtrain/core/array.h"

namespace mt {

// Batched matrix product of the last two dims: a (..., M, K) @ b (..., K, N) -> (..., M, N)
// with NumPy broadcasting of the batch dims. trans_a / trans_b read a as (..., K, M) /
// b as (..., N, K) without copying. f32, bf16 and f16 (oneDNN, f32 accumulation).
Array matmul(const Array& a, const Array& b, bool trans_a = false, bool trans_b = false);

}  // namespace mt
