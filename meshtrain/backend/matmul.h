#pragma once
// Batched matrix multiply: cpu/matmul.cpp (oneDNN, primitives cached so repeated shapes cost
// only an execute) and cuda/matmul.cpp (cuBLASLt, descriptors and algorithms cached per shape).
#include <cstddef>
#include <cstdint>

namespace mt::kernels {

// The operands' storage and how they are multiplied:
// - f32, bf16, f16: inputs and output in that dtype, f32 accumulation;
// - bf16_f32: bf16 inputs, f32 output;
// - f32_as_bf16: f32 inputs and output, each operand rounded to bf16 first (the rounding
//   happens in the kernel's staging buffers, never in the caller's arrays);
// - f32_as_tf32: f32 inputs and output; the GPU may use TF32 tensor cores. The CPU has no
//   TF32 unit and computes these in f32, within TF32's tolerance.
enum class MatmulDType { f32, bf16, f16, bf16_f32, f32_as_bf16, f32_as_tf32 };

// How many GEMM plans (one per product shape) each backend keeps: MT_MATMUL_PLAN_CACHE, else
// 1024. A bad value warns and gives 1024 rather than throwing: the first matmul may run
// inside an OpenMP region, where an exception would end the process.
size_t matmul_plan_capacity_from_env();

}  // namespace mt::kernels

// matmul: C[b] = op(A[b]) @ op(B[b]), op transposing when trans_* is set. All buffers are dense
//   row-major on the backend's device; bf16/f16 buffers hold raw 16-bit patterns.
//   a: (batch_a, M, K), or (batch_a, K, M) when trans_a; b: (batch_b, K, N), or (batch_b, N, K)
//   when trans_b; c: (batch, M, N). batch_a / batch_b are each 1 (broadcast) or batch.
//   accumulate adds into c (beta = 1) instead of overwriting it. Throws mt::Error starting with
//   "[matmul]" on bad arguments or library failures. Safe to call from several threads.
//   Every dtype runs on every CPU: where oneDNN has no kernel for a 16-bit dtype
//   (cpu_features(): bf16 below AVX-512, f16 below AVX512_FP16), the inputs are widened to f32,
//   the f32 matmul runs and the output is rounded back to nearest even.
// matmul_bias: c (M, N) = op(a) @ op(b) + bias for one product (a linear layer's rows folded
//   into M), bias (N,) in c's dtype (f32 for bf16_f32, f32_as_bf16 and f32_as_tf32). The GPU
//   adds it to the f32 accumulator in cuBLASLt's epilogue (no second pass over c; 16-bit c is
//   rounded once); the CPU adds it in a pass over c right after the product, rounding as
//   matmul followed by add rounds, so the f32 result equals the composed ops bit for bit.
#define MT_MATMUL_KERNELS                                                                          \
  void matmul(kernels::MatmulDType dtype, const void* a, const void* b, void* c, int64_t batch,     \
              int64_t batch_a, int64_t batch_b, int64_t M, int64_t N, int64_t K, bool trans_a,      \
              bool trans_b, bool accumulate = false);                                              \
  void matmul_bias(kernels::MatmulDType dtype, const void* a, const void* b, const void* bias,      \
                   void* c, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b);

namespace mt::cpu {
MT_MATMUL_KERNELS
// The number of cached oneDNN matmul primitives, and a way to drop them (e.g. after a run with
// many one-off shapes). Clearing is safe while other threads are calling matmul.
size_t matmul_cache_size();
void matmul_clear_cache();
// The cache keeps at most this many primitives (default 1024, or MT_MATMUL_PLAN_CACHE), dropping
// the one unused longest (cpu/matmul_plans.h); returns the previous capacity, plans >= 1.
size_t set_matmul_cache_capacity(size_t plans);
// Primitives not yet destroyed (the cached ones and those threads still hold), and primitives
// created since the process started (a count that keeps rising in a steady run means the cache
// is too small for its shapes).
size_t matmul_plans_alive();
uint64_t matmul_plans_created();
// The most elements (default 4Mi: 16 MB of f32) of an operand block the widened path (16-bit
// products on a CPU without native kernels for them) stages at once; larger unbatched products
// run in blocks. Returns the previous limit; tests lower it to reach the blocked path.
size_t set_matmul_staging_limit(size_t elements);
// One unbatched product of the many small ones a kernel makes inside its own threads (the
// fused attention's blocks), as matmul computes it but always on a cached oneDNN primitive,
// whose packing space is the calling thread's reused scratchpad. The jit GEMM (dnnl_sgemm),
// which matmul prefers for most f32 shapes, mallocs its packing buffers per call, and in the
// OpenMP workers those pages were faulted in again and again: BERT-base's f32 step peaked
// 146 MB higher with its attention blocks on it.
void matmul_in_kernel(kernels::MatmulDType dtype, const void* a, const void* b, void* c, int64_t M, int64_t N,
                      int64_t K, bool trans_a, bool trans_b, bool accumulate);
}  // namespace mt::cpu
namespace mt::cuda {
MT_MATMUL_KERNELS
// Whether large GEMMs may time cuBLASLt's candidate algorithms on first use. Multi-process runs
// turn it off: each process would choose by its own timings, and replicated products must round
// alike on every rank.
void set_matmul_tuning(bool allowed);
// As the CPU's: cuBLASLt descriptors and chosen algorithms cached per product shape (about a
// KB of host memory each), at most this many (default matmul_plan_capacity_from_env()), the
// one unused longest dropped; returns the previous capacity, plans >= 1.
size_t set_matmul_cache_capacity(size_t plans);
size_t matmul_cache_size();
uint64_t matmul_plans_created();
}  // namespace mt::cuda
