#pragma once
// The fused (flash-style) attention kernels: cpu/attention.cpp (under f32 math the reference
// every GPU kernel is tested against) and cuda/attention.cu with cuda/attention_tensor_core.cu.
// softmax(scale · q kᵀ) v per (batch·head) with the bottom-right causal mask, optional dropout
// on the probabilities (the Philox stream of `key` at the flat index of each probability in
// the (B·H, Tq, Tk) array, as dropout()), without storing the probabilities: the backward
// recomputes them from the saved row log-sum-exps.
#include <string>

#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"

namespace mt::kernels {

// The score a masked key takes: bf16's lowest finite value (0xFF7F), the composed form's on
// bf16 scores. Any f32 score plus it rounds to it, so the cuDNN route's additive bias
// (cuda/cudnn_attention.h) gives masked keys this very score, log-sum-exps included, and either
// route's backward takes the other's forward.
constexpr float kMaskedScore = -3.38953139e38f;

struct FlashAttentionShape {
  int64_t batch_heads = 0, tq = 0, tk = 0, d = 0;  // q: (BH, Tq, D); k, v: (BH / group, Tk, D)
  // Query heads per key/value head (grouped-query attention): q's slice bh reads k's and v's
  // slice bh / group, whose gradients sum over the group's query heads. 1: one each.
  int64_t group = 1;
  float scale = 1.0f;
  bool causal = true;  // key j visible to query i when j <= i + (Tk - Tq)
  double dropout_rate = 0.0;
  RngKey dropout_key{};
  // Optional key-padding mask (mask_batches, Tk): key j is visible to the queries of batch
  // b = bh / heads only where key_mask[b · Tk + j] (row 0 for every b when mask_batches is 1).
  // Masked scores take kMaskedScore, as the composed form's where() on bf16 scores: a row with
  // no visible key attends uniformly.
  const bool* key_mask = nullptr;
  int64_t heads = 1, mask_batches = 1;  // heads: query heads per batch (H; k and v have H / group)
  // The arrays' layout: (B, H, T, D) (false), or heads inner (B, T, H, D) (true), the layout a
  // (B, T, H·D) projection has once reshaped, so no transposes are needed around the op. In
  // both, slice bh = b·H + h; the heads-inner rows of a slice are H·D (k, v: H / group · D)
  // elements apart. Out, dq, dk and dv have their inputs' layout; lse stays (BH, Tq).
  bool heads_inner = false;
  // Heads-inner only: elements between a slice's rows in q and dq (q_row_stride) and in k, v, dk
  // and dv (kv_row_stride); 0 means H·D and H / group · D. Larger strides read the three from
  // one packed (B, T, H + 2·Hkv, D) projection (q, k and v given as views at its head offsets)
  // and write dq, dk and dv into one packed gradient the same way. Out, g and lse stay
  // contiguous (out and g rows H·D apart).
  int64_t q_row_stride = 0, kv_row_stride = 0;
  // How the GPU's tensor-core kernels multiply (the matmul precision in force when the op
  // ran): f32-accurate (each f32 operand split into two TF32 parts, three products), TF32 or
  // bf16 operands; f32 accumulation and f32 softmax in every case. The CPU multiplies f32 for
  // f32 and tf32, and bf16 operands (oneDNN's GEMMs) for bf16 and for bf16 arrays.
  enum class Operands : uint8_t { f32, tf32, bf16 } operands = Operands::f32;
  // Optional (the GPU's tensor-core kernels, with dropout): the forward stores the keep flags
  // it draws here, and the backward reads them instead of drawing them again (twice: its dK/dV
  // and dQ kernels). Two words per (slice bh, 64-key tile kt, query row i), at
  // ((bh · ceil(Tk / 64) + kt) · Tq + i) · 2: bit c of the pair keeps key kt · 64 + c
  // (cuda::dropout_keep_bits_words gives the size, 0 where unused).
  uint32_t* keep_bits = nullptr;
  // cuDNN's dropout (MT_ATTENTION_CUDNN=all; cuda/cudnn_attention.h) is decided per call by the
  // forward and followed by its backward, whose kernels could not draw cuDNN's mask again. The
  // forward sets *cudnn_dropout_record (when given) to the seed array it drew its mask from
  // (left undefined when it drew dropout()'s mask); the backward is handed that array as
  // cudnn_dropout_seed and then runs on cuDNN with it, or fails saying why.
  Array* cudnn_dropout_record = nullptr;
  const Array* cudnn_dropout_seed = nullptr;
};

}  // namespace mt::kernels

// flash_attention_forward: out (BH, Tq, D) in q's dtype; lse (BH, Tq) f32 =
//   log Σ_j exp(scale · q_i·k_j) over visible j.
// flash_attention_backward: first-order gradients from the output cotangent g (BH, Tq, D);
//   dq/dk/dv have q/k/v's shapes and dtype. Heads-inner arrays (s.heads_inner) are taken by the
//   CPU and by the GPU's tensor-core kernels only.
#define MT_ATTENTION_KERNELS                                                                               \
  void flash_attention_forward(const Array& q, const Array& k, const Array& v,                             \
                               const kernels::FlashAttentionShape& s, Array& out, Array& lse);             \
  void flash_attention_backward(const Array& q, const Array& k, const Array& v, const Array& out,          \
                                const Array& lse, const Array& g, const kernels::FlashAttentionShape& s,   \
                                Array& dq, Array& dk, Array& dv);

namespace mt::cpu { MT_ATTENTION_KERNELS }
namespace mt::cuda {
MT_ATTENTION_KERNELS
// The GPU kernels take q's arrays at this head dim: the tensor-core kernels where they apply,
// else the CUDA-core kernels' head dims up to 64 (the CPU takes any).
bool flash_attention_supported(const Array& q, int64_t head_dim);
// The tensor-core kernels (attention_tensor_core.cu) take f32 and bf16 arrays with head dims up
// to kMaxTensorCoreHeadDim on sm_80 and newer (where the GPU grants their shared memory), and
// key-padding masks; flash_attention_forward/backward choose them where they apply, the
// CUDA-core kernels of attention.cu elsewhere (f16 arrays, older GPUs).
constexpr int64_t kMaxTensorCoreHeadDim = 128;
bool flash_attention_tensor_cores(const Array& q, int64_t head_dim);
// The words of s.keep_bits the tensor-core kernels would fill for q's arrays under s (0: they
// draw the backward's dropout flags again; always 0 without dropout, off the GPU, and unless
// MT_ATTENTION_DROPOUT_BITS=1 while the two are being measured against each other).
int64_t dropout_keep_bits_words(const Array& q, const kernels::FlashAttentionShape& s);
// Kernel launches that took the tensor-core kernels' double-buffered (cp.async) form in this
// process: a test comparing the two forms checks the form it meant to compare ran.
uint64_t flash_attention_pipelined_launches();
// only_batches (device memory, one i32 per batch b = slice / heads, or null for all): the
// kernels compute the slices of the batches flagged nonzero and leave the others' outputs as
// they are (the cuDNN route's rows its key-mask bias cannot make uniform: cudnn_attention.h).
void flash_attention_forward_tc(const Array& q, const Array& k, const Array& v, const kernels::FlashAttentionShape& s,
                                Array& out, Array& lse, const int32_t* only_batches = nullptr);
void flash_attention_backward_tc(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                                 const Array& g, const kernels::FlashAttentionShape& s, Array& dq, Array& dk, Array& dv,
                                 const int32_t* only_batches = nullptr);
// The forwards and backwards cuDNN's fused engine has run in this process
// (MT_ATTENTION_CUDNN=1; cuda/cudnn_attention.h), and the last shape it refused with cuDNN's
// reason ("" when none): what the GPU tests and logs check the route by.
uint64_t cudnn_attention_forwards();
uint64_t cudnn_attention_backwards();
std::string cudnn_attention_last_refusal();
// MT_ATTENTION_CUDNN=auto's choices so far, one line per shape and direction: the route and
// both routes' median times.
std::string cudnn_attention_measured_choices();
}  // namespace mt::cuda
