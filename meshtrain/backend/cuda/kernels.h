#pragma once
// The CUDA kernel set: one entry point per CPU kernel (backend/cpu/*.h), same arguments, same
// results (f32 to rounding; integer, index and mask results bit-equal). Arrays passed here live
// on a GPU; outputs are allocated by the caller (the primitive, under its inputs' device).
// Every kernel is enqueued on the device's compute stream and returns at once; only
// check_indices (which must report a bad index before anything reads it) waits.
// Without CUDA in the build these are defined by no_cuda.cpp and throw.
#include <string>

#include "meshtrain/backend/cpu/attention_kernel.h"
#include "meshtrain/backend/cpu/elementwise.h"
#include "meshtrain/backend/cpu/matmul_kernel.h"
#include "meshtrain/backend/cpu/optimizer_kernels.h"
#include "meshtrain/backend/cpu/paged_attention_kernel.h"
#include "meshtrain/backend/cpu/random_kernels.h"
#include "meshtrain/backend/cpu/reduce.h"
#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"

namespace mt::cuda {

// ---- elementwise (elementwise.cu) ----
void unary(cpu::UnaryOp op, const Array& x, Array& out);
void binary(cpu::BinaryOp op, const Array& a, const Array& b, Array& out);
void where(const Array& cond, const Array& a, const Array& b, Array& out);
void relu_backward(const Array& x, const Array& g, Array& out);
void gelu_backward(const Array& x, const Array& g, bool approximate, Array& out);
void cast(const Array& x, Array& out);

// ---- layout (strided_copy.cu) ----
void strided_copy(const void* src, const std::vector<int64_t>& src_strides, void* dst,
                  const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& dims, size_t elem_size);

// ---- reductions (reduce.cu) ----
void reduce(cpu::ReduceOp op, const Array& x, Array& out, int64_t outer, int64_t r, int64_t inner);
void argmax(const Array& x, Array& out, int64_t outer, int64_t r, int64_t inner);

// ---- softmax and norms (softmax.cu, norm.cu) ----
void softmax_forward(const Array& x, Array& y, int64_t outer, int64_t r, int64_t inner, bool log);
void causal_softmax_forward(const Array& x, Array& y, int64_t blocks, int64_t tq, int64_t tk, float scale);
void softmax_backward(const Array& y, const Array& g, Array& dx, int64_t rows, int64_t r, float scale);
void norm_forward(bool center, const Array& x, const Array& weight, const Array& bias, double eps, Array& y,
                  Array& mean, Array& rstd);
void norm_backward(bool center, const Array& g, const Array& x, const Array& weight, const Array& mean,
                   const Array& rstd, Array& dx, Array* dweight, Array* dbias);

// ---- fused attention (attention.cu) ----
bool flash_attention_supported(int64_t head_dim);  // the GPU kernels take head dims up to 64
// The tensor-core kernels (attention_tensor_core.cu) take f32 arrays with head dims up to 64
// on sm_80 and newer; they also take a key-padding mask. flash_attention_forward/backward
// choose them where they apply.
bool flash_attention_tensor_cores(const Array& q, int64_t head_dim);
void flash_attention_forward_tc(const Array& q, const Array& k, const Array& v, const cpu::FlashAttentionShape& s,
                                Array& out, Array& lse);
void flash_attention_backward_tc(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                                 const Array& g, const cpu::FlashAttentionShape& s, Array& dq, Array& dk, Array& dv);
void flash_attention_forward(const Array& q, const Array& k, const Array& v, const cpu::FlashAttentionShape& s,
                             Array& out, Array& lse);
void flash_attention_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                              const Array& g, const cpu::FlashAttentionShape& s, Array& dq, Array& dk, Array& dv);

// ---- paged KV cache (paged_attention.cu) ----
void paged_kv_write(Array& pool, const Array& kv, const std::vector<int64_t>& slots);
void paged_attention(const Array& q, const Array& k_pool, const Array& v_pool, const cpu::PagedRows& rows, float scale,
                     Array& out);

// ---- loss (loss.cu) ----
void cross_entropy_forward(const Array& logits, const Array& labels, int64_t ignore_index, float smoothing, Array& loss,
                           Array& lse);
void cross_entropy_backward(const Array& logits, const Array& labels, const Array& lse, const Array& row_scale,
                            int64_t ignore_index, float smoothing, Array& grad);

// ---- indexing (indexing.cu) ----
void check_indices(const Array& idx, int64_t size, const char* op, const std::string& context);
void take(const Array& x, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner);
void scatter_add(const Array& upd, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner);
void take_along_axis(const Array& x, const Array& idx, Array& out, int axis);
void scatter_add_along_axis(const Array& upd, const Array& idx, Array& out, int axis);
void top_k(const Array& x, Array& values, Array& indices, int64_t outer, int64_t a, int64_t inner, int64_t k);
void one_hot(const Array& ids, Array& out, int64_t num_classes);

// ---- random (random.cu): the same Philox stream as the CPU, element by element ----
void dropout(const Array& x, Array& out, const RngKey& key, double rate, const cpu::StreamBlock& block);

// ---- optimizer (optimizer.cu) ----
void adam_moments(const Array& g, const Array& m, const Array& v, const cpu::AdamHyper& h, Array& out);
void adam_direction(const Array& m, const Array& v, const Array* p, const cpu::AdamHyper& h, Array& out);
// As cpu::adam_*_multi: one launch per few dozen tensors (their pointers travel in the
// launch's parameters), instead of one per tensor.
void adam_moments_multi(const std::vector<Array>& in, const cpu::AdamHyper& h, Array& out);
void adam_direction_multi(const std::vector<Array>& in, const std::vector<float>& decays, const cpu::AdamHyper& h,
                          Array& out);

// ---- matmul (matmul.cpp, cuBLASLt) ----
// As cpu::matmul; `tf32` lets f32 products use TF32 tensor cores (--precision tf32).
void matmul(cpu::MatmulDType dtype, const void* a, const void* b, void* c, int64_t batch, int64_t batch_a,
            int64_t batch_b, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, bool accumulate, bool tf32);
// Whether large GEMMs may time cuBLASLt's candidate algorithms on first use (matmul.cpp).
// Multi-process runs turn it off: each process would choose by its own timings, and
// replicated products must round alike on every rank.
void set_matmul_tuning(bool allowed);

}  // namespace mt::cuda
