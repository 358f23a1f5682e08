#include "meshtrain/backend/cuda/cudnn_attention_graphs.h"

#include <string>

#include "meshtrain/core/error.h"

namespace mt::cuda {

using cudnn_graph::Descriptor;
using cudnn_graph::Graph;
using Dims = std::array<int64_t, 4>;

CudnnAttentionGeometry cudnn_attention_geometry(DType dtype, const kernels::FlashAttentionShape& s) {
  CudnnAttentionGeometry g;
  g.io = dtype == DType::f16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  g.heads = s.heads;
  g.batch = s.batch_heads / s.heads;
  g.kv_heads = s.heads / s.group;
  g.tq = s.tq;
  g.tk = s.tk;
  g.d = s.d;
  g.causal = s.causal;
  g.dropout_rate = s.dropout_rate;
  g.key_bias = s.key_mask != nullptr;
  g.bias_batches = s.mask_batches;
  const int64_t H = g.heads, Hk = g.kv_heads, D = s.d;
  if (!s.heads_inner) {
    g.q_strides = g.o_strides = {H * s.tq * D, s.tq * D, D, 1};
    g.k_strides = g.v_strides = {Hk * s.tk * D, s.tk * D, D, 1};
  } else {
    // Rows of a slice are a row of the (B, T, H·D) projection apart (more in a packed one).
    const int64_t ldq = s.q_row_stride ? s.q_row_stride : H * D;
    const int64_t ldk = s.kv_row_stride ? s.kv_row_stride : Hk * D;
    const int64_t ldo = H * D;
    g.q_strides = {s.tq * ldq, D, ldq, 1};
    g.k_strides = g.v_strides = {s.tk * ldk, D, ldk, 1};
    g.o_strides = {s.tq * ldo, D, ldo, 1};
  }
  return g;
}

namespace {

// (B, H, D, T): the same memory as a (B, H, T, D) tensor with its last two strides swapped.
Dims transposed(const Dims& strides) { return {strides[0], strides[1], strides[3], strides[2]}; }

// The tensors both graphs share and a maker of virtual ones (ids past every array's).
struct Tensors {
  Graph& g;
  const CudnnAttentionGeometry& geo;
  int64_t next_uid = 100;
  const Dims one{1, 1, 1, 1};
  const Dims scores, scores_strides, rows, rows_strides;

  Tensors(Graph& graph, const CudnnAttentionGeometry& geometry)
      : g(graph),
        geo(geometry),
        scores{geo.batch, geo.heads, geo.tq, geo.tk},
        scores_strides{geo.heads * geo.tq * geo.tk, geo.tq * geo.tk, geo.tk, 1},
        rows{geo.batch, geo.heads, geo.tq, 1},
        rows_strides{geo.heads * geo.tq, geo.tq, 1, 1} {}

  const Descriptor& array(int64_t uid, cudnnDataType_t dtype, const Dims& dims, const Dims& strides,
                          const std::string& name) {
    return g.tensor({uid, dtype, dims, strides}, name);
  }
  const Descriptor& scalar(int64_t uid, const std::string& name) {
    return g.tensor({uid, CUDNN_DATA_FLOAT, one, one, false, true}, name);
  }
  const Descriptor& virtual_tensor(cudnnDataType_t dtype, const Dims& dims, const Dims& strides,
                                   const std::string& name) {
    return g.tensor({next_uid++, dtype, dims, strides, true}, name);
  }
  const Descriptor& virtual_scores(const std::string& name, cudnnDataType_t dtype = CUDNN_DATA_FLOAT) {
    return virtual_tensor(dtype, scores, scores_strides, name);
  }
  const Descriptor& virtual_rows(const std::string& name) {
    return virtual_tensor(CUDNN_DATA_FLOAT, rows, rows_strides, name);
  }
  // The scores seen as (B, H, Tk, Tq) in the arrays' dtype: the operand of a product with
  // the scores' rows as its inner dim.
  const Descriptor& transposed_scores(const Descriptor& x, const std::string& name) {
    const Descriptor& t = virtual_tensor(geo.io, {geo.batch, geo.heads, geo.tk, geo.tq},
                                         {geo.heads * geo.tq * geo.tk, geo.tq * geo.tk, 1, geo.tk}, name);
    g.reshape(x, t, name);
    return t;
  }

  // x · factor over the scores (x itself without a factor: the optional dropout steps).
  const Descriptor& times(const Descriptor& x, const Descriptor* factor, const std::string& name) {
    if (!factor) return x;
    const Descriptor& y = virtual_scores(name);
    g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, x, y, factor, nullptr, -1, name);
    return y;
  }

  // cuDNN's dropout mask over the scores (1 kept, 0 dropped) from the device's seed and offset.
  const Descriptor& dropout_mask() {
    const Descriptor& seed = array(kCudnnSeed, CUDNN_DATA_INT64, one, one, "dropout seed");
    const Descriptor& offset = array(kCudnnOffset, CUDNN_DATA_INT64, one, one, "dropout offset");
    const Descriptor& mask = virtual_scores("dropout mask");
    g.rng_bernoulli(1.0 - geo.dropout_rate, seed, offset, mask, "dropout mask");
    return mask;
  }

  // The scaled scores plus the key mask's bias (the frontend's bias, added where it adds it:
  // after the scale, before the causal mask), or the scores themselves without a mask.
  const Descriptor& plus_key_bias(const Descriptor& scaled) {
    if (!geo.key_bias) return scaled;
    const int64_t rows = geo.bias_rows_written ? geo.tq : 1;
    const Descriptor& bias = array(kCudnnBias, geo.io, {geo.bias_batches, 1, geo.tq, geo.tk},
                                   {rows * geo.tk, rows * geo.tk, rows == 1 ? 0 : geo.tk, 1}, "key mask bias");
    const Descriptor& biased = virtual_scores("S + key mask bias");
    g.pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, scaled, biased, &bias, nullptr, -1, "key mask bias");
    return biased;
  }

  // Key j visible to query i where i >= j (Tq == Tk: the top-left and bottom-right diagonals
  // agree); the others take the mask value, by value (-inf, or the lowest float on cuDNN
  // before 9.10, whose softmax wanted it).
  const Descriptor& causal_mask(const Descriptor& logits) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const Descriptor& mask_value = scalar(kCudnnMaskValue, "mask value");
    const Descriptor& row = virtual_scores("row index", CUDNN_DATA_INT32);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, logits, row, nullptr, nullptr, 2, "row index");
    const Descriptor& col = virtual_scores("column index", CUDNN_DATA_INT32);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, logits, col, nullptr, nullptr, 3, "column index");
    const Descriptor& visible = virtual_scores("visible", CUDNN_DATA_BOOLEAN);
    g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, visible, &col, nullptr, -1, "row >= column");
    const Descriptor& masked = virtual_scores("masked scores");
    g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, logits, masked, &mask_value, &visible, -1, "causal mask");
    return masked;
  }
};

}  // namespace

void build_cudnn_attention_forward(Graph& g, const CudnnAttentionGeometry& geo) {
  const int64_t B = geo.batch, H = geo.heads, Hk = geo.kv_heads, Tq = geo.tq, Tk = geo.tk, D = geo.d;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  Tensors t(g, geo);
  const Descriptor& q = t.array(kCudnnQ, geo.io, {B, H, Tq, D}, geo.q_strides, "Q");
  // The first product takes K transposed: (B, Hk, D, Tk) over the same memory.
  const Descriptor& kt = t.array(kCudnnK, geo.io, {B, Hk, D, Tk}, transposed(geo.k_strides), "K transposed");
  const Descriptor& v = t.array(kCudnnV, geo.io, {B, Hk, Tk, D}, geo.v_strides, "V");
  const Descriptor& o = t.array(kCudnnO, geo.io, {B, H, Tq, D}, geo.o_strides, "O");
  const Descriptor& stats = t.array(kCudnnStats, f32, t.rows, t.rows_strides, "Stats");
  const Descriptor& scale = t.scalar(kCudnnScale, "scale");

  const Descriptor& s = t.virtual_scores("S");
  g.matmul(q, kt, s, "S = Q Kt");
  const Descriptor& scaled = t.virtual_scores("scale S");
  g.pointwise(CUDNN_POINTWISE_MUL, f32, s, scaled, &scale, nullptr, -1, "scale S");
  const Descriptor& biased = t.plus_key_bias(scaled);
  const Descriptor& logits = geo.causal ? t.causal_mask(biased) : biased;
  // Softmax with its statistics: max, exp(S - max), their sum, log-sum-exp = max + log(sum).
  const Descriptor& row_max = t.virtual_rows("row max");
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, logits, row_max, "row max");
  const Descriptor& shifted = t.virtual_scores("S - max");
  g.pointwise(CUDNN_POINTWISE_SUB, f32, logits, shifted, &row_max, nullptr, -1, "S - max");
  const Descriptor& e = t.virtual_scores("exp(S - max)");
  g.pointwise(CUDNN_POINTWISE_EXP, f32, shifted, e, nullptr, nullptr, -1, "exp");
  const Descriptor& row_sum = t.virtual_rows("row sum");
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum, "row sum");
  const Descriptor& log_sum = t.virtual_rows("log row sum");
  g.pointwise(CUDNN_POINTWISE_LOG, f32, row_sum, log_sum, nullptr, nullptr, -1, "log row sum");
  g.pointwise(CUDNN_POINTWISE_ADD, f32, row_max, stats, &log_sum, nullptr, -1, "log-sum-exp");
  // P in the arrays' dtype: the second product's operand (with dropout, after the mask and
  // the 1 / (1 - rate) scale).
  if (geo.dropout_rate <= 0) {
    const Descriptor& p = t.virtual_scores("P", geo.io);
    g.pointwise(CUDNN_POINTWISE_DIV, f32, e, p, &row_sum, nullptr, -1, "P = exp / sum");
    g.matmul(p, v, o, "O = P V");
    return;
  }
  const Descriptor& p = t.virtual_scores("P");
  g.pointwise(CUDNN_POINTWISE_DIV, f32, e, p, &row_sum, nullptr, -1, "P = exp / sum");
  const Descriptor& mask = t.dropout_mask();
  const Descriptor& kept = t.virtual_scores("P * mask");
  g.pointwise(CUDNN_POINTWISE_MUL, f32, p, kept, &mask, nullptr, -1, "P * mask");
  const Descriptor& dropout_scale = t.scalar(kCudnnDropoutScale, "dropout scale");
  const Descriptor& dropped = t.virtual_scores("dropout(P)", geo.io);
  g.pointwise(CUDNN_POINTWISE_MUL, f32, kept, dropped, &dropout_scale, nullptr, -1, "dropout(P)");
  g.matmul(dropped, v, o, "O = dropout(P) V");
}

void build_cudnn_attention_backward(Graph& g, const CudnnAttentionGeometry& geo) {
  MT_CHECK(geo.kv_heads > 0 && geo.heads % geo.kv_heads == 0, "[cudnn attention] ", geo.heads,
           " query heads cannot share ", geo.kv_heads, " key/value heads");
  const int64_t B = geo.batch, H = geo.heads, Hk = geo.kv_heads, Tq = geo.tq, Tk = geo.tk, D = geo.d;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  Tensors t(g, geo);
  const Descriptor& q = t.array(kCudnnQ, geo.io, {B, H, Tq, D}, geo.q_strides, "Q");
  const Descriptor& kt = t.array(kCudnnK, geo.io, {B, Hk, D, Tk}, transposed(geo.k_strides), "K transposed");
  const Descriptor& vt = t.array(kCudnnV, geo.io, {B, Hk, D, Tk}, transposed(geo.v_strides), "V transposed");
  const Descriptor& o = t.array(kCudnnO, geo.io, {B, H, Tq, D}, geo.o_strides, "O");
  const Descriptor& d_o = t.array(kCudnnDO, geo.io, {B, H, Tq, D}, geo.o_strides, "dO");
  const Descriptor& stats = t.array(kCudnnStats, f32, t.rows, t.rows_strides, "Stats");
  const Descriptor& dq = t.array(kCudnnDQ, geo.io, {B, H, Tq, D}, geo.q_strides, "dQ");
  const Descriptor& dk = t.array(kCudnnDK, geo.io, {B, Hk, Tk, D}, geo.k_strides, "dK");
  const Descriptor& dv = t.array(kCudnnDV, geo.io, {B, Hk, Tk, D}, geo.v_strides, "dV");
  // Grouped-query heads: each query head's dK and dV (B, H, Tk, D), summed over its group into
  // the key/value head's, as the frontend lowers them; the products write dK and dV directly
  // otherwise.
  auto grouped = [&](const Descriptor& out, const std::string& name) -> const Descriptor& {
    if (Hk == H) return out;
    return t.virtual_tensor(geo.io, {B, H, Tk, D}, {H * Tk * D, Tk * D, D, 1}, name + " per query head");
  };
  auto sum_groups = [&](const Descriptor& per_head, const Descriptor& out, const std::string& name) {
    if (&per_head != &out) g.reduction(CUDNN_REDUCE_TENSOR_ADD, per_head, out, name + " over each group");
  };
  const Descriptor& dk_heads = grouped(dk, "dK");
  const Descriptor& dv_heads = grouped(dv, "dV");
  const Descriptor& softmax_sum = t.array(kCudnnSoftmaxSum, f32, t.rows, t.rows_strides, "softmax sum");
  const Descriptor& dq_accum = t.array(kCudnnDqAccum, f32, {B, H, Tq, D}, {H * Tq * D, Tq * D, D, 1}, "dQ in f32");
  const Descriptor& scale = t.scalar(kCudnnScale, "scale");
  const bool dropout = geo.dropout_rate > 0;
  // With dropout: 1 / (1 - rate), and (1 - rate) in the softmax sum's place of 1 (kCudnnOne
  // carries the value the caller gives it).
  const Descriptor* dropout_scale = dropout ? &t.scalar(kCudnnDropoutScale, "dropout scale") : nullptr;
  const Descriptor& one = t.scalar(kCudnnOne, dropout ? "1 - rate" : "one");
  const Descriptor* mask = dropout ? &t.dropout_mask() : nullptr;

  // Σ_d dO·O per row: softmax's backward subtracts it from dP.
  const Descriptor& d_o_o = t.virtual_tensor(f32, {B, H, Tq, D}, {H * Tq * D, Tq * D, H * D, 1}, "dO * O");
  g.pointwise(CUDNN_POINTWISE_MUL, f32, d_o, d_o_o, &o, nullptr, -1, "dO * O");
  const Descriptor& row_dots = t.virtual_rows("row dots");
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o_o, row_dots, "row dots");
  g.pointwise(CUDNN_POINTWISE_MUL, f32, row_dots, softmax_sum, &one, nullptr, -1, "softmax sum");
  // P again, from the forward's log-sum-exp: exp(scale · Q Kᵀ - Stats), masked.
  const Descriptor& s = t.virtual_scores("S");
  g.matmul(q, kt, s, "S = Q Kt");
  const Descriptor& scaled = t.virtual_scores("scale S");
  g.pointwise(CUDNN_POINTWISE_MUL, f32, s, scaled, &scale, nullptr, -1, "scale S");
  const Descriptor& shifted = t.virtual_scores("S - Stats");
  g.pointwise(CUDNN_POINTWISE_SUB, f32, t.plus_key_bias(scaled), shifted, &stats, nullptr, -1, "S - Stats");
  const Descriptor& logits = geo.causal ? t.causal_mask(shifted) : shifted;
  const Descriptor& p = t.virtual_scores("P");
  g.pointwise(CUDNN_POINTWISE_EXP, f32, logits, p, nullptr, nullptr, -1, "P = exp");
  // dV = dropout(P)ᵀ dO.
  const Descriptor& dropped = t.times(t.times(p, mask, "P * mask"), dropout_scale, "dropout(P)");
  g.matmul(t.transposed_scores(dropped, "P transposed"), d_o, dv_heads, "dV = Pt dO");
  sum_groups(dv_heads, dv, "dV");
  // dS = P ∘ (mask ∘ dO Vᵀ - softmax sum) · dropout scale · scale.
  const Descriptor& dp = t.virtual_scores("dP");
  g.matmul(d_o, vt, dp, "dP = dO Vt");
  const Descriptor& centered = t.virtual_scores("dP - softmax sum");
  g.pointwise(CUDNN_POINTWISE_SUB, f32, t.times(dp, mask, "dP * mask"), centered, &softmax_sum, nullptr, -1,
              "dP - softmax sum");
  const Descriptor& ds_unscaled = t.virtual_scores("P * (dP - softmax sum)");
  g.pointwise(CUDNN_POINTWISE_MUL, f32, centered, ds_unscaled, &p, nullptr, -1, "P * (dP - softmax sum)");
  const Descriptor& ds = t.virtual_scores("dS");
  g.pointwise(CUDNN_POINTWISE_MUL, f32, t.times(ds_unscaled, dropout_scale, "dropout scale of dS"), ds, &scale, nullptr,
              -1, "dS");
  // dK = dSᵀ Q; dQ = dS K, accumulated in f32 and then written in the arrays' dtype.
  g.matmul(t.transposed_scores(ds, "dS transposed"), q, dk_heads, "dK = dSt Q");
  sum_groups(dk_heads, dk, "dK");
  // K back from Kᵀ, f32 as the frontend leaves it (the dQ product is f32 dS times f32 K).
  const Descriptor& k = t.virtual_tensor(CUDNN_DATA_FLOAT, {B, Hk, Tk, D}, geo.k_strides, "K");
  g.reshape(kt, k, "K");
  g.matmul(ds, k, dq_accum, "dQ = dS K");
  g.pointwise(CUDNN_POINTWISE_IDENTITY, f32, dq_accum, dq, nullptr, nullptr, -1, "dQ");
}

}  // namespace mt::cuda
