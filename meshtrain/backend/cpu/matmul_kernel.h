#pragma once
// Batched matrix multiply on the CPU through oneDNN, with primitive caching so repeated
// shapes cost only an execute.
#include <cstddef>
#include <cstdint>

namespace mt::cpu {

// bf16_f32: bf16 inputs, f32 output (the product of bf16 operands, accumulated and stored
// in f32). f32_as_bf16: f32 inputs and output, each operand rounded to bf16 first (the
// MatmulPrecision::bf16 mixed precision; the rounding happens in the kernel's staging
// buffers, never in the caller's arrays).
enum class MatmulDType { f32, bf16, f16, bf16_f32, f32_as_bf16 };

// C[b] = op(A[b]) @ op(B[b]), op transposing when trans_* is set. All buffers are dense
// row-major; bf16/f16 buffers hold raw 16-bit patterns. Accumulation is in f32 and the
// output has the inputs' dtype (f32 for bf16_f32 and f32_as_bf16). batch_a / batch_b are each 1 (broadcast) or batch.
// accumulate adds into c (beta = 1) instead of overwriting it.
// Throws mt::Error (a std::runtime_error) starting with "[matmul]" on bad arguments or
// oneDNN failures. Safe to call concurrently from several threads.
void matmul(MatmulDType dtype,
            const void* a,  // (batch_a, M, K), or (batch_a, K, M) when trans_a
            const void* b,  // (batch_b, K, N), or (batch_b, N, K) when trans_b
            void* c,        // (batch, M, N)
            int64_t batch, int64_t batch_a, int64_t batch_b, int64_t M, int64_t N, int64_t K,
            bool trans_a, bool trans_b, bool accumulate = false);

// Every dtype runs on every CPU. Where oneDNN has no kernel for a 16-bit dtype
// (cpu_features(): bf16 below AVX-512, f16 below AVX512_FP16), the inputs are widened to
// f32, the f32 matmul runs and the output is rounded back to nearest even.

// Number of cached oneDNN matmul primitives, and a way to drop them (e.g. after a run with
// many one-off shapes). Clearing is safe while other threads are calling matmul.
size_t matmul_cache_size();
void matmul_clear_cache();


}  // namespace mt::cpu
