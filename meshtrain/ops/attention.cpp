#include "meshtrain/ops/attention.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cmath>
#include <limits>

#include "meshtrain/backend/attention.h"
#include "meshtrain/backend/softmax.h"
#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/nn_ops.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("attention", {"causal_softmax", "flash_attention"});

Array causal_mask(int64_t tq, int64_t tk) {
  Array m = Array::empty({tq, tk}, DType::boolean, Device::cpu());
  bool* p = m.data<bool>();
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j) p[i * tk + j] = j <= i + (tk - tq);
  return m.to(current_device());
}

namespace {

// softmax(scale · scores) over the last axis with keys after each query's position masked
// (the bottom-right-aligned causal mask when Tq < Tk), fused in one pass.
class CausalSoftmaxPrimitive final : public prim::Primitive {
 public:
  explicit CausalSoftmaxPrimitive(double scale) : scale_(scale) {}
  const char* name() const override { return "causal_softmax"; }
  prim::OpKind kind() const override { return prim::OpKind::attention; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    const Array& scores = in[0];
    MT_CHECK(is_floating(scores.dtype()) && scores.ndim() >= 2,
             "[causal_softmax] expects floating (..., Tq, Tk) scores, got ", scores.str());
    MT_CHECK(scores.dim(-2) <= scores.dim(-1), "[causal_softmax] more queries (", scores.dim(-2), ") than keys (",
             scores.dim(-1), ") in ", scores.str());
    return {scores.shape(), scores.dtype()};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    const Array& scores = in[0];
    const int64_t tq = scores.dim(-2), tk = scores.dim(-1);
    Array y = Array::empty(o.shape, o.dtype);
    if (scores.numel() > 0)
      MT_KERNEL(y, causal_softmax_forward, scores, y, scores.numel() / (tq * tk), tq, tk, float(scale_));
    return y;
  }
  bool keeps_output() const override { return true; }
  // Masked probabilities are 0, so their gradient vanishes with them.
  std::vector<Array> vjp(const prim::Saved& s, const Array& g) const override {
    const Array& y = s.output;
    if (!autodiff::grad_enabled() && g.shape() == y.shape() && g.dtype() == y.dtype() && y.numel() > 0) {
      // First order: one fused pass per row. A recorded backward (second order) composes ops.
      Array dx = Array::empty(y.shape(), y.dtype(), y.device());
      const int64_t r = y.dim(-1);
      MT_KERNEL(dx, softmax_backward, y, g, dx, y.numel() / r, r, float(scale_));
      return {dx};
    }
    Array yf = cast(s.output_for_vjp(), DType::f32);
    Array gf = cast(g, DType::f32);
    Array dx = mul(mul(yf, sub(gf, sum(mul(gf, yf), {-1}, true))), scale_);
    return {cast(dx, s.dtypes[0])};
  }
  // The mask depends on the query's position: both attention axes must be whole on each rank.
  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape& mesh) const override {
    const int nd = in[0].shape.ndim();
    return layout::rules::gather_dims(in, mesh, {nd - 2, nd - 1});
  }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo& o) const override {
    return {5.0 * double(o.shape.numel()), 2.0 * double(o.shape.numel()) * double(dtype_size(o.dtype))};
  }

 private:
  double scale_;
};

}  // namespace

namespace {

// (B, Hkv, T, D) -> (B, Hkv * rep, T, D): each key/value head serves `rep` query heads.
Array repeat_heads(const Array& x, int64_t rep) {
  if (rep == 1) return x;
  const int64_t b = x.dim(0), h = x.dim(1), t = x.dim(2), d = x.dim(3);
  Array e = broadcast_to(reshape(x, {b, h, 1, t, d}), Shape{b, h, rep, t, d});
  return reshape(e, {b, h * rep, t, d});
}
// (B, Hkv · rep, T, D) -> (B, Hkv, T, D): the sum over each key/value head's `rep` query heads
// (repeat_heads' transpose).
Array sum_heads(const Array& x, int64_t rep) {
  if (rep == 1) return x;
  return sum(reshape(x, {x.dim(0), x.dim(1) / rep, rep, x.dim(2), x.dim(3)}), {2});
}

// softmax(scale · q kᵀ, causal) (dropout) v over (B, H, T, D) arrays, fused: the probabilities
// are never stored (aux keeps the rows' log-sum-exps); the first-order backward recomputes
// them. Under nested differentiation the VJP differentiates the composed form, so gradients
// of gradients stay exact. Grouped-query attention: k and v may have fewer heads, Hkv
// dividing H; query head h reads key/value head h / (H / Hkv), never repeated in memory.
// Heads inner, the arrays are (B, T, H, D) (a projection's layout) and the kernels read and
// write them in place; the output and the gradients keep it. Packed, the one input is the
// (B, T, H + 2·Hkv, D) output of a fused q | k | v projection, read in place as three
// heads-inner arrays, and its gradient is written as one array of that shape: the projection's
// backward takes it whole, with no slices or concatenation on either side.
enum class AttentionLayout { heads_outer, heads_inner, packed };

class FlashAttentionPrimitive final : public prim::Primitive {
 public:
  FlashAttentionPrimitive(double scale, bool causal, double rate, RngKey key,
                          AttentionLayout layout = AttentionLayout::heads_outer, int64_t heads = 0,
                          int64_t kv_heads = 0)
      : scale_(scale),
        causal_(causal),
        rate_(rate),
        key_(key),
        operands_(operands_of(matmul_precision())),
        layout_(layout),
        heads_(heads),
        kv_heads_(kv_heads) {}
  const char* name() const override { return "flash_attention"; }
  prim::OpKind kind() const override { return prim::OpKind::attention; }
  bool packed() const { return layout_ == AttentionLayout::packed; }
  bool heads_inner() const { return layout_ != AttentionLayout::heads_outer; }
  // The inputs' query heads, key/value heads, query and key lengths and head dim.
  int64_t query_heads(const std::vector<Array>& in) const { return packed() ? heads_ : in[0].dim(heads_inner() ? 2 : 1); }
  int64_t key_heads(const std::vector<Array>& in) const { return packed() ? kv_heads_ : in[1].dim(heads_inner() ? 2 : 1); }
  int64_t query_time(const std::vector<Array>& in) const { return in[0].dim(heads_inner() ? 1 : 2); }
  int64_t key_time(const std::vector<Array>& in) const { return in[packed() ? 0 : 1].dim(heads_inner() ? 1 : 2); }
  size_t mask_index() const { return packed() ? 1 : 3; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    const Array& q = in[0];
    if (packed()) {
      MT_CHECK(q.ndim() == 4 && heads_ > 0 && kv_heads_ > 0 && heads_ % kv_heads_ == 0 &&
                   q.dim(2) == heads_ + 2 * kv_heads_ && is_floating(q.dtype()),
               "[flash_attention] expects a floating packed (B, T, H + 2·Hkv, D) q | k | v with H = ", heads_,
               " and Hkv = ", kv_heads_, " dividing it, got ", q.str());
    } else {
      const Array &k = in[1], &v = in[2];
      const int64_t hq = query_heads(in), hk = key_heads(in);
      MT_CHECK(q.ndim() == 4 && k.shape() == v.shape() && k.ndim() == 4 && q.dim(0) == k.dim(0) &&
                   ((hk > 0 && hq >= hk && hq % hk == 0) || (hq == 0 && hk == 0)) && q.dim(3) == k.dim(3) &&
                   q.dtype() == k.dtype() && k.dtype() == v.dtype() && is_floating(q.dtype()),
               "[flash_attention] expects floating ", (heads_inner() ? "(B, Tq, H, D) q and (B, Tk, Hkv, D)" :
                                                                      "(B, H, Tq, D) q and (B, Hkv, Tk, D)"),
               " k, v of one dtype with Hkv dividing H, got q ", q.str(), ", k ", k.str(), ", v ", v.str());
    }
    MT_CHECK(!causal_ || query_time(in) <= key_time(in), "[flash_attention] more queries (", query_time(in),
             ") than keys (", key_time(in), ") under the causal mask");
    MT_CHECK(!heads_inner() || q.device().is_cpu() || cuda::flash_attention_tensor_cores(q, q.dim(3)),
             "[flash_attention] heads-inner arrays on the GPU need the tensor-core kernels (f32 or bf16, head dim <= ",
             cuda::kMaxTensorCoreHeadDim, ", sm_80+), got q ", q.str(), " on ", q.device().str());
    if (in.size() > mask_index()) {
      const Array& mask = in[mask_index()];
      MT_CHECK(is_key_padding_mask(mask, q.dim(0), key_time(in)), "[flash_attention] key mask must be bool (",
               q.dim(0), " or 1, 1, 1, ", key_time(in), "), got ", mask.str());
      MT_CHECK(q.device().is_cpu() || cuda::flash_attention_tensor_cores(q, q.dim(3)),
               "[flash_attention] a key mask on the GPU needs f32 or bf16 arrays with head dim <= ",
               cuda::kMaxTensorCoreHeadDim, " (sm_80+, and f32 past head dim 64 more shared memory per block than "
               "sm_86/89 grant), got q ",
               q.str(), " on ", q.device().str());
      MT_CHECK(!causal_, "[flash_attention] a key mask is supported without the causal mask only");
    }
    if (packed()) return {Shape{q.dim(0), q.dim(1), heads_, q.dim(3)}, q.dtype()};
    return {q.shape(), q.dtype()};
  }
  // shape_of for the backward: the forward's dropout keep bits, where it kept them.
  kernels::FlashAttentionShape backward_shape_of(const prim::Saved& saved) const {
    kernels::FlashAttentionShape s = shape_of(saved.inputs);
    if (saved.aux.size() > 1 && saved.aux[1].defined()) s.keep_bits = static_cast<uint32_t*>(saved.aux[1].raw());
    if (saved.aux.size() > 2 && saved.aux[2].defined()) s.cudnn_dropout_seed = &saved.aux[2];
    return s;
  }
  kernels::FlashAttentionShape shape_of(const std::vector<Array>& in) const {
    const Array& q = in[0];
    kernels::FlashAttentionShape s;
    const int64_t hq = query_heads(in), hk = key_heads(in);
    s.batch_heads = q.dim(0) * hq, s.tq = query_time(in), s.tk = key_time(in), s.d = q.dim(3);
    s.group = hk > 0 ? hq / hk : 1;
    s.scale = float(scale_), s.causal = causal_, s.dropout_rate = rate_, s.dropout_key = key_;
    s.operands = operands_;
    s.heads = std::max<int64_t>(hq, 1);
    s.heads_inner = heads_inner();
    if (packed()) s.q_row_stride = s.kv_row_stride = q.dim(2) * q.dim(3);
    if (in.size() > mask_index()) {
      s.key_mask = in[mask_index()].data<bool>();
      s.mask_batches = in[mask_index()].dim(0);
    }
    return s;
  }
  // q, k and v of a packed (B, T, H + 2·Hkv, D) array (its gradient alike): views from their
  // first head on, which the kernels read with the packed row stride. A non-empty array.
  struct QkvViews {
    Array q, k, v;
  };
  QkvViews packed_views(const Array& qkv) const {
    const Array flat = qkv.view_as_shape({qkv.numel()});
    const int64_t d = qkv.dim(3), n = flat.numel();
    auto from_head = [&](int64_t head) { return flat.view_elements(head * d, {n - head * d}); };
    return {from_head(0), from_head(heads_), from_head(heads_ + kv_heads_)};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>& aux) const override {
    Array out = Array::empty(o.shape, o.dtype);
    kernels::FlashAttentionShape s = shape_of(in);
    Array lse = Array::empty({s.batch_heads * s.tq}, DType::f32);
    // Where the GPU kernels keep the dropout flags they draw for the backward (aux[1]).
    Array keep_bits;
    const int64_t words = autodiff::should_record(in) ? cuda::dropout_keep_bits_words(in[0], s) : 0;
    if (words > 0) {
      // Zeroed: the dK/dV kernel reads the words of some key tiles no forward warp visits (their
      // verdicts fall on keys its queries cannot see, so no result depends on them).
      keep_bits = Array::zeros({words}, DType::i32);
      s.keep_bits = static_cast<uint32_t*>(keep_bits.raw());
    }
    // The seed of cuDNN's dropout mask when the forward drew it (aux[2]; cuda/cudnn_attention.h).
    Array cudnn_dropout;
    s.cudnn_dropout_record = &cudnn_dropout;
    if (!packed()) {
      MT_KERNEL(out, flash_attention_forward, in[0], in[1], in[2], s, out, lse);
    } else if (in[0].numel() > 0) {
      const QkvViews qkv = packed_views(in[0]);
      MT_KERNEL(out, flash_attention_forward, qkv.q, qkv.k, qkv.v, s, out, lse);
    }
    aux = {lse, keep_bits, cudnn_dropout};
    return out;
  }
  bool keeps_output() const override { return true; }
  // A recorded (second-order) backward redraws dropout()'s mask: not the one cuDNN drew.
  void check_recordable(const prim::Saved& s) const {
    MT_CHECK(!autodiff::grad_enabled() || s.aux.size() < 3 || !s.aux[2].defined(),
             "[flash_attention] a second-order gradient through an attention whose dropout mask cuDNN drew "
             "(MT_ATTENTION_CUDNN=all) is not available: its recorded backward draws dropout()'s mask; run it with "
             "MT_ATTENTION_CUDNN=1 or unset");
  }
  std::vector<Array> vjp(const prim::Saved& s, const Array& g) const override {
    check_recordable(s);
    if (packed()) return packed_vjp(s, g);
    const Array &q = s.inputs[0], &k = s.inputs[1], &v = s.inputs[2];
    std::vector<Array> grads(s.inputs.size());  // none for the mask
    if (autodiff::grad_enabled() && heads_inner()) {
      // Recorded (second order), heads inner: the (B, H, T, D) form's composed backward on the
      // transposed arrays, its gradients transposed back.
      auto heads_out = [](const Array& x) { return swap_axes(x, 1, 2); };
      std::vector<Array> inputs = {heads_out(q), heads_out(k), heads_out(v)};
      if (s.inputs.size() > 3) inputs.push_back(s.inputs[3]);
      prim::Saved outer = s;
      outer.inputs = inputs;
      const FlashAttentionPrimitive heads_outer(scale_, causal_, rate_, key_);
      std::vector<Array> inner = heads_outer.vjp(outer, heads_out(g));
      for (size_t i = 0; i < 3; ++i)
        if (inner[i].defined()) grads[i] = heads_out(inner[i]);
      return grads;
    }
    if (autodiff::grad_enabled()) {
      // Recorded (second order): the composed backward, written with ops; the key/value
      // heads repeated for it, their gradients summed back over each group.
      const int64_t rep = k.dim(1) > 0 ? q.dim(1) / k.dim(1) : 1;
      const Array kr = repeat_heads(k, rep), vr = repeat_heads(v, rep);
      Array raw = matmul(q, kr, false, true), probs;
      if (causal_) {
        probs = causal_softmax(raw, scale_);
      } else {
        Array scores = mul(raw, scale_);
        if (s.inputs.size() > 3) scores = where(s.inputs[3], scores, scalar_like(scores, lowest_finite(scores.dtype())));
        probs = softmax(scores, -1);
      }
      Array dropped = rate_ > 0 ? dropout(probs, rate_, key_, true) : probs;
      Array dv = matmul(dropped, g, true, false);
      Array dp = matmul(g, vr, false, true);
      if (rate_ > 0) dp = dropout(dp, rate_, key_, true);
      Array ds = mul(mul(probs, sub(dp, sum(mul(dp, probs), {-1}, true))), scale_);
      // where() passes no gradient to masked scores (nonzero only in a row with no visible key).
      if (s.inputs.size() > 3) ds = where(s.inputs[3], ds, zeros_like(ds));
      grads[0] = matmul(ds, kr), grads[1] = sum_heads(matmul(ds, q, true, false), rep), grads[2] = sum_heads(dv, rep);
      return grads;
    }
    Array dq = Array::empty(q.shape(), q.dtype(), q.device()), dk = Array::empty(k.shape(), k.dtype(), k.device()),
          dv = Array::empty(v.shape(), v.dtype(), v.device());
    const Array gc = g.dtype() == q.dtype() ? g : cast(g, q.dtype());
    MT_KERNEL(dq, flash_attention_backward, q, k, v, s.output, s.aux[0], gc, backward_shape_of(s), dq, dk, dv);
    // The backward kernel runs outside the dispatcher: its four products count here.
    prim::count_model_flops(2 * square_flops(s.inputs));
    grads[0] = dq, grads[1] = dk, grads[2] = dv;
    return grads;
  }
  // The packed form's gradient: one (B, T, H + 2·Hkv, D) array, q's, k's and v's gradients
  // written at their heads by the kernel (recorded, second order: the heads-inner form's on the
  // three slices, concatenated back).
  std::vector<Array> packed_vjp(const prim::Saved& s, const Array& g) const {
    const Array& qkv = s.inputs[0];
    std::vector<Array> grads(s.inputs.size());  // none for the mask
    if (autodiff::grad_enabled()) {
      prim::Saved split = s;
      split.inputs = {slice(qkv, 2, 0, heads_), slice(qkv, 2, heads_, heads_ + kv_heads_),
                      slice(qkv, 2, heads_ + kv_heads_, heads_ + 2 * kv_heads_)};
      if (s.inputs.size() > 1) split.inputs.push_back(s.inputs[1]);
      const FlashAttentionPrimitive inner(scale_, causal_, rate_, key_, AttentionLayout::heads_inner);
      std::vector<Array> parts = inner.vjp(split, g);
      grads[0] = concatenate({parts[0], parts[1], parts[2]}, 2);
      return grads;
    }
    Array dqkv = Array::empty(qkv.shape(), qkv.dtype(), qkv.device());
    if (qkv.numel() > 0) {
      const Array gc = g.dtype() == qkv.dtype() ? g : cast(g, qkv.dtype());
      const QkvViews in = packed_views(qkv);
      QkvViews d = packed_views(dqkv);
      MT_KERNEL(dqkv, flash_attention_backward, in.q, in.k, in.v, s.output, s.aux[0], gc, backward_shape_of(s), d.q,
                d.k, d.v);
    }
    prim::count_model_flops(2 * square_flops(s.inputs));
    grads[0] = dqkv;
    return grads;
  }
  // Model FLOPs count the whole (Tq, Tk) square, causal or not, as the composed form's GEMMs
  // and the usual 6N + 12·L·T·C per token formula do, so MFU does not depend on the form.
  double square_flops(const std::vector<Array>& in) const {
    return 4.0 * double(in[0].dim(0) * query_heads(in) * query_time(in)) * double(key_time(in)) *
           double(in[0].dim(3));
  }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo& o) const override {
    return {square_flops(in), double(4 * o.shape.numel()) * double(dtype_size(o.dtype))};
  }
  bool counts_model_flops() const override { return true; }

 private:
  using Operands = kernels::FlashAttentionShape::Operands;
  static Operands operands_of(MatmulPrecision p) {
    return p == MatmulPrecision::bf16 ? Operands::bf16 : p == MatmulPrecision::tf32 ? Operands::tf32 : Operands::f32;
  }
  double scale_;
  bool causal_;
  double rate_;
  RngKey key_;
  Operands operands_;  // the matmul precision when the op ran: how the GPU kernels multiply
  AttentionLayout layout_;
  int64_t heads_, kv_heads_;  // packed: the query and key/value heads in the one input
};

}  // namespace

namespace {
std::atomic<AttentionKernel> g_attention_kernel{AttentionKernel::automatic};
}  // namespace

void set_attention_kernel(AttentionKernel kernel) { g_attention_kernel.store(kernel); }
AttentionKernel attention_kernel() { return g_attention_kernel.load(); }
AttentionKernel attention_kernel_from_name(const std::string& name) {
  if (name == "auto" || name == "automatic") return AttentionKernel::automatic;
  if (name == "composed") return AttentionKernel::composed;
  if (name == "fused") return AttentionKernel::fused;
  throw Error("[attention] expected auto, composed or fused, got '" + name + "'");
}

Array flash_attention(const Array& q, const Array& k, const Array& v, double scale, bool causal, double dropout_rate,
                      const RngKey& dropout_key, const Array& key_mask) {
  MT_CHECK(q.defined() && k.defined() && v.defined(), "[flash_attention] undefined input array");
  auto primitive = std::make_shared<FlashAttentionPrimitive>(scale, causal, dropout_rate, dropout_key);
  if (key_mask.defined()) return prim::apply(primitive, {q, k, v, key_mask});
  return prim::apply(primitive, {q, k, v});
}

Array flash_attention_heads_inner(const Array& q, const Array& k, const Array& v, double scale, bool causal,
                                  double dropout_rate, const RngKey& dropout_key, const Array& key_mask) {
  MT_CHECK(q.defined() && k.defined() && v.defined(), "[flash_attention] undefined input array");
  auto primitive =
      std::make_shared<FlashAttentionPrimitive>(scale, causal, dropout_rate, dropout_key, AttentionLayout::heads_inner);
  if (key_mask.defined()) return prim::apply(primitive, {q, k, v, key_mask});
  return prim::apply(primitive, {q, k, v});
}

Array flash_attention_packed(const Array& qkv, int64_t heads, int64_t kv_heads, double scale, bool causal,
                             double dropout_rate, const RngKey& dropout_key, const Array& key_mask) {
  MT_CHECK(qkv.defined(), "[flash_attention] undefined input array");
  auto primitive = std::make_shared<FlashAttentionPrimitive>(scale, causal, dropout_rate, dropout_key,
                                                             AttentionLayout::packed, heads, kv_heads);
  if (key_mask.defined()) return prim::apply(primitive, {qkv, key_mask});
  return prim::apply(primitive, {qkv});
}

bool is_key_padding_mask(const Array& mask, int64_t batch, int64_t tk) {
  return mask.defined() && mask.dtype() == DType::boolean && mask.ndim() == 4 &&
         (mask.dim(0) == batch || mask.dim(0) == 1) && mask.dim(1) == 1 && mask.dim(2) == 1 && mask.dim(3) == tk &&
         !mask.distributed();
}

Array causal_softmax(const Array& scores, double scale) {
  MT_CHECK(scores.defined(), "[causal_softmax] expects floating (..., Tq, Tk) scores, got undefined");
  return prim::apply(std::make_shared<CausalSoftmaxPrimitive>(scale), {scores});
}

namespace {
// Any mask: masked scores take the lowest finite value, then softmax.
Array masked_softmax(Array scores, const Array& mask, bool causal, int64_t tq, int64_t tk) {
  Array allowed = mask;
  if (allowed.defined()) {
    MT_CHECK(allowed.dtype() == DType::boolean, "[attention] mask must be bool, got ", allowed.str());
    broadcast_shapes(allowed.shape(), scores.shape(), "attention mask");
  }
  if (causal) {
    Array c = causal_mask(tq, tk);
    allowed = allowed.defined() ? logical_and(allowed, c) : c;
  }
  if (allowed.defined())
    scores = where(allowed, scores, scalar_like(scores, lowest_finite(scores.dtype())));
  return softmax(scores, -1);
}
}  // namespace

namespace {

// Whether attention over these arrays runs the fused kernel (flash_attention): q's dtype and
// device, batch B, Tq and Tk, head dims d (q, k) and dv (v). See AttentionKernel.
bool runs_fused(const Array& q, const Array& k, const Array& v, int64_t batch, int64_t tq, int64_t tk, int64_t d,
                int64_t dv, const Array& mask, const AttentionOptions& o) {
  const bool plain = !q.distributed() && !k.distributed() && !v.distributed();
  const AttentionKernel kernel = attention_kernel();
  // Automatic: fused on the CPU, whose blocks of query rows run on oneDNN's GEMMs
  // (cpu/attention.cpp: bf16 operands for bf16 arrays or --precision bf16, f32 otherwise) and
  // beat the composed form at every length measured. On a GPU: fused wherever the tensor-core
  // kernels take the arrays (f32 or bf16, head dim <= 128, sm_80+).
  const bool cpu_fused = q.device().is_cpu();
  const bool gpu_tensor_cores = !q.device().is_cpu() && cuda::flash_attention_tensor_cores(q, d);
  const bool fused =
      kernel == AttentionKernel::fused || (kernel == AttentionKernel::automatic && (cpu_fused || gpu_tensor_cores));
  // Decoders: causal, no mask. Encoders (BERT): not causal, at most a key-padding mask (on a
  // GPU, for the tensor-core kernels). Other masks and biases take the composed form.
  const bool decoder =
      o.causal && !mask.defined() && tq <= tk && (q.device().is_cpu() || cuda::flash_attention_supported(q, d));
  const bool encoder = !o.causal && (q.device().is_cpu() || gpu_tensor_cores) &&
                       (!mask.defined() || (mask.device() == q.device() && is_key_padding_mask(mask, batch, tk)));
  return fused && (decoder || encoder) && !o.bias.defined() && plain && d == dv;
}

double scale_of(const AttentionOptions& o, int64_t head_dim) {
  return o.scale > 0 ? o.scale : 1.0 / std::sqrt(double(head_dim));
}

}  // namespace

Array scaled_dot_product_attention(const Array& q, const Array& k, const Array& v, const Array& mask,
                                   const AttentionOptions& o) {
  MT_CHECK(q.defined() && k.defined() && v.defined(), "[attention] undefined input array");
  MT_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, "[attention] expects (B, H, T, D) arrays, got q ",
           q.str(), ", k ", k.str(), ", v ", v.str());
  MT_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), "[attention] dtype mismatch: q ", q.str(), ", k ",
           k.str(), ", v ", v.str());
  MT_CHECK(q.dim(0) == k.dim(0) && k.dim(0) == v.dim(0), "[attention] batch mismatch: q ", q.str(), ", k ",
           k.str(), ", v ", v.str());
  MT_CHECK(q.dim(3) == k.dim(3), "[attention] head dim mismatch: q ", q.str(), ", k ", k.str());
  MT_CHECK(k.dim(1) == v.dim(1) && k.dim(2) == v.dim(2), "[attention] k ", k.str(), " and v ", v.str(),
           " must share heads and length");
  MT_CHECK(k.dim(1) > 0 && q.dim(1) % k.dim(1) == 0, "[attention] query heads ", q.dim(1),
           " are not a multiple of key/value heads ", k.dim(1));
  const int64_t rep = q.dim(1) / k.dim(1), tq = q.dim(2), tk = k.dim(2);
  const double scale = scale_of(o, q.dim(3));
  // The common decoder and encoder cases run fused (no (Tq, Tk) probabilities in memory) by
  // default where the fused kernels are the faster form (see AttentionKernel).
  if (runs_fused(q, k, v, q.dim(0), tq, tk, q.dim(3), v.dim(3), mask, o)) {
    return flash_attention(q, k, v, scale, o.causal,
                           o.train ? o.dropout_rate : 0.0, o.dropout_key, mask);
  }

  Array raw = matmul(q, repeat_heads(k, rep), false, true);  // (B, H, Tq, Tk)
  Array probs;
  if (o.causal && !mask.defined() && !o.bias.defined() && tq <= tk) {
    probs = causal_softmax(raw, scale);  // the common decoder case, fused
  } else {
    Array scores = scale == 1.0 ? raw : mul(raw, scale);
    if (o.bias.defined()) {
      MT_CHECK(is_floating(o.bias.dtype()), "[attention] bias must be floating, got ", o.bias.str());
      broadcast_shapes(o.bias.shape(), raw.shape(), "attention bias");
      scores = add(scores, o.bias.dtype() == scores.dtype() ? o.bias : cast(o.bias, scores.dtype()));
    }
    probs = masked_softmax(scores, mask, o.causal, tq, tk);
  }
  if (o.train && o.dropout_rate > 0) probs = dropout(probs, o.dropout_rate, o.dropout_key, true);
  return matmul(probs, repeat_heads(v, rep));  // (B, H, Tq, Dv)
}


Array attention_heads_inner(const Array& q, const Array& k, const Array& v, const Array& mask,
                            const AttentionOptions& o) {
  MT_CHECK(q.defined() && k.defined() && v.defined(), "[attention] undefined input array");
  MT_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, "[attention] expects heads-inner (B, T, H, D) arrays, got q ",
           q.str(), ", k ", k.str(), ", v ", v.str());
  MT_CHECK(k.dim(1) == v.dim(1) && k.dim(2) == v.dim(2), "[attention] k ", k.str(), " and v ", v.str(),
           " must share length and heads");
  const int64_t tq = q.dim(1), tk = k.dim(1);
  // On a GPU the heads-inner layout is the tensor-core kernels' alone.
  const bool kernels_take_it = q.device().is_cpu() || cuda::flash_attention_tensor_cores(q, q.dim(3));
  if (kernels_take_it && q.dtype() == k.dtype() && k.dtype() == v.dtype() && q.dim(0) == k.dim(0) &&
      k.dim(0) == v.dim(0) && q.dim(3) == k.dim(3) && k.dim(2) > 0 && q.dim(2) % k.dim(2) == 0 &&
      runs_fused(q, k, v, q.dim(0), tq, tk, q.dim(3), v.dim(3), mask, o))
    return flash_attention_heads_inner(q, k, v, scale_of(o, q.dim(3)), o.causal, o.train ? o.dropout_rate : 0.0,
                                       o.dropout_key, mask);
  // Elsewhere the heads move out, as split_heads and merge_heads move them (the same ops).
  return swap_axes(scaled_dot_product_attention(swap_axes(q, 1, 2), swap_axes(k, 1, 2), swap_axes(v, 1, 2), mask, o),
                   1, 2);
}

Array attention_packed(const Array& qkv, int64_t heads, int64_t kv_heads, const Array& mask,
                       const AttentionOptions& o) {
  MT_CHECK(qkv.defined(), "[attention] undefined input array");
  MT_CHECK(qkv.ndim() == 4 && heads > 0 && kv_heads > 0 && heads % kv_heads == 0 &&
               qkv.dim(2) == heads + 2 * kv_heads,
           "[attention] expects a packed (B, T, H + 2·Hkv, D) q | k | v with H = ", heads, " and Hkv = ", kv_heads,
           " dividing it, got ", qkv.str());
  const int64_t t = qkv.dim(1), d = qkv.dim(3);
  const bool kernels_take_it = qkv.device().is_cpu() || cuda::flash_attention_tensor_cores(qkv, d);
  if (kernels_take_it && runs_fused(qkv, qkv, qkv, qkv.dim(0), t, t, d, d, mask, o))
    return flash_attention_packed(qkv, heads, kv_heads, scale_of(o, d), o.causal, o.train ? o.dropout_rate : 0.0,
                                  o.dropout_key, mask);
  return attention_heads_inner(slice(qkv, 2, 0, heads), slice(qkv, 2, heads, heads + kv_heads),
                               slice(qkv, 2, heads + kv_heads, heads + 2 * kv_heads), mask, o);
}


}  // namespace mt
