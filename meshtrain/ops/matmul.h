#pragma once
#include <string>

#include "meshtrain/backend/matmul.h"
#include "meshtrain/core/array.h"

namespace mt {

// How f32 matmuls multiply (the role of jax.default_matmul_precision or torch's CPU
// autocast, limited to matmuls): `f32` multiplies in f32; `bf16` rounds both operands to
// bf16 and accumulates and stores in f32, so parameters, gradients and every other op stay
// f32 while the GEMMs run at the bf16 rate (~1.8x f32 on AVX512-BF16 CPUs). Matmuls of
// bf16/f16 arrays are unaffected. The setting is per thread; an op's gradient matmuls use
// the setting that was in force when the op ran forward. `tf32` lets GPU matmuls of f32
// arrays use TF32 tensor cores (10-bit mantissa products, f32 accumulation); on the CPU it
// is f32.
enum class MatmulPrecision { f32, bf16, tf32 };
MatmulPrecision matmul_precision();
// "f32", "tf32" or "bf16"; anything else throws mt::Error naming the flag `what`.
MatmulPrecision matmul_precision_from_name(const std::string& name, const char* what = "matmul precision");
const char* matmul_precision_name(MatmulPrecision p);

// How the backend multiplies operands of `operands`' dtype under `precision` (f32 arrays follow
// the precision; 16-bit arrays multiply as they are), its output in that dtype.
kernels::MatmulDType matmul_kernel_dtype(DType operands, MatmulPrecision precision);

// Sets the calling thread's matmul precision until the scope ends.
class MatmulPrecisionScope {
 public:
  explicit MatmulPrecisionScope(MatmulPrecision p);
  ~MatmulPrecisionScope();
  MatmulPrecisionScope(const MatmulPrecisionScope&) = delete;
  MatmulPrecisionScope& operator=(const MatmulPrecisionScope&) = delete;

 private:
  MatmulPrecision saved_;
};

// Batched matrix product of the last two dims: a (..., M, K) @ b (..., K, N) -> (..., M, N)
// with NumPy broadcasting of the batch dims. trans_a / trans_b read a as (..., K, M) /
// b as (..., N, K) without copying. f32, bf16 and f16 (oneDNN, f32 accumulation).
Array matmul(const Array& a, const Array& b, bool trans_a = false, bool trans_b = false);

}  // namespace mt
