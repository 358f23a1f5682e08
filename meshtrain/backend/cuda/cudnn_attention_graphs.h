#pragma once
// The operation graphs of flash attention for cuDNN's fused attention engine, built with the
// graph API (cudnn_graph.h) in the shape its engine recognizes (the pattern cuDNN's own C++
// frontend lowers scaled dot-product attention to): S = scale · Q Kᵀ in f32, the causal mask
// as index comparisons, softmax with its row log-sum-exp; the backward recomputes P from that
// log-sum-exp. The route that runs them is cudnn_attention.h.
#include <array>

#include "meshtrain/backend/attention.h"
#include "meshtrain/backend/cuda/cudnn_graph.h"

namespace mt::cuda {

// One attention as cuDNN's 4-d tensors (batch, heads, rows, head dim), strides in elements:
// (B, H, T, D) arrays or heads inner (B, T, H, D), packed projections included. The output
// and its gradient have q's rows but are never packed; dq, dk and dv have q's, k's and v's.
struct CudnnAttentionGeometry {
  cudnnDataType_t io = CUDNN_DATA_BFLOAT16;
  int64_t batch = 0, heads = 0, kv_heads = 0, tq = 0, tk = 0, d = 0;
  bool causal = false;
  // Dropout on the probabilities with cuDNN's own Philox mask (seed and offset read from the
  // device: kCudnnSeed, kCudnnOffset); 0: none.
  double dropout_rate = 0.0;
  // A key-padding mask as an additive bias on the scaled scores (kCudnnBias: (bias_batches, Tk)
  // in the arrays' dtype, read as (bias_batches, 1, Tq, Tk) with a 0 stride over the rows, as
  // PyTorch hands cuDNN an expanded mask; with bias_rows_written, (bias_batches, Tq, Tk), each
  // row written out, should cuDNN refuse the 0 stride).
  bool key_bias = false, bias_rows_written = false;
  int64_t bias_batches = 1;
  std::array<int64_t, 4> q_strides{}, k_strides{}, v_strides{}, o_strides{};
};
CudnnAttentionGeometry cudnn_attention_geometry(DType dtype, const kernels::FlashAttentionShape& s);

// The graphs' tensors, by the ids their variant packs name them with. Stats is the op's
// log-sum-exp (B·H, Tq) f32; SoftmaxSum (Σ_d dO·O per row) and DqAccum (dQ in f32) are f32
// buffers the backward's caller provides.
enum CudnnAttentionUid : int64_t {
  kCudnnQ = 1,
  kCudnnK,
  kCudnnV,
  kCudnnO,
  kCudnnStats,
  kCudnnScale,
  kCudnnMaskValue,
  kCudnnDO,
  kCudnnDQ,
  kCudnnDK,
  kCudnnDV,
  kCudnnSoftmaxSum,
  kCudnnDqAccum,
  kCudnnOne,
  kCudnnSeed,
  kCudnnOffset,
  kCudnnDropoutScale,
  kCudnnBias
};

// Build the graphs into `g`: every tensor and operation finalized, the operation graph not yet
// (that needs a GPU's handle: cudnn_graph::make_plan). With grouped-query heads the backward
// sums each group's dK and dV. With dropout both draw the same mask for the same seed
// and offset; it is cuDNN's, not the Philox stream of dropout() and the kernels here.
void build_cudnn_attention_forward(cudnn_graph::Graph& g, const CudnnAttentionGeometry& geo);
void build_cudnn_attention_backward(cudnn_graph::Graph& g, const CudnnAttentionGeometry& geo);

}  // namespace mt::cuda
