#include "meshtrain/ops/linear.h"

#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/backend/matmul.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("linear", {"linear_bias"});

namespace {

// Inputs x, w, bias. Keeps x and w for the backward (as matmul does); the bias's gradient needs
// only the cotangent.
class LinearBiasPrimitive final : public prim::Primitive {
 public:
  LinearBiasPrimitive(bool trans_w, MatmulPrecision precision) : trans_w_(trans_w), precision_(precision) {}
  const char* name() const override { return "linear_bias"; }
  prim::OpKind kind() const override { return prim::OpKind::gemm; }

  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    const Array &x = in[0], &w = in[1], &bias = in[2];
    MT_CHECK(x.defined() && w.defined() && bias.defined(), "[linear_bias] undefined input array");
    MT_CHECK(is_floating(x.dtype()) && w.dtype() == x.dtype() && bias.dtype() == x.dtype(),
             "[linear_bias] x, w and bias must share a floating dtype, got ", x.str(), ", ", w.str(), " and ",
             bias.str());
    MT_CHECK(w.ndim() == 2 && x.ndim() >= 1, "[linear_bias] expects x (..., K) and a 2-D weight, got ", x.str(), " and ",
             w.str());
    const int64_t k = trans_w_ ? w.dim(1) : w.dim(0), n = trans_w_ ? w.dim(0) : w.dim(1);
    MT_CHECK(x.dim(-1) == k, "[linear_bias] x ", x.str(), " has ", x.dim(-1), " features, the weight ", w.str(),
             (trans_w_ ? " (read transposed)" : ""), " takes ", k);
    MT_CHECK(bias.ndim() == 1 && bias.dim(0) == n, "[linear_bias] bias ", bias.str(), " must be (", n, ",)");
    std::vector<int64_t> dims(x.shape().dims().begin(), x.shape().dims().end() - 1);
    dims.push_back(n);
    return {Shape(dims), x.dtype()};
  }

  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    const Array &x = in[0], &w = in[1], &bias = in[2];
    const int64_t n = o.shape.dim(-1), k = x.dim(-1), m = x.numel() / std::max<int64_t>(k, 1);
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, matmul_bias, matmul_kernel_dtype(x.dtype(), precision_), x.raw(), w.raw(), bias.raw(), out.raw(),
              k == 0 ? o.shape.numel() / std::max<int64_t>(n, 1) : m, n, k, false, trans_w_);
    return out;
  }

  // matmul's cotangents with the rows folded (one GEMM each), and add's for the bias.
  std::vector<Array> vjp(const prim::Saved& s, const Array& g) const override {
    MatmulPrecisionScope scope(precision_);
    const Array &x = s.inputs[0], &w = s.inputs[1];
    std::vector<Array> grads(3);
    if (s.wants(0)) grads[0] = matmul(g, w, false, !trans_w_);
    if (s.wants(1)) {
      const Array x2 = reshape(x, {-1, x.dim(-1)}), g2 = reshape(g, {-1, g.dim(-1)});
      grads[1] = trans_w_ ? matmul(g2, x2, true, false) : matmul(x2, g2, true, false);
    }
    if (s.wants(2)) grads[2] = sum_to(g, s.shapes[2]);
    return grads;
  }
  uint32_t keeps_inputs() const override { return 0b011; }

  bool counts_model_flops() const override { return true; }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo& o) const override {
    prim::Cost c = Primitive::cost(in, o);
    c.flops = 2.0 * double(o.shape.numel()) * double(in[0].dim(-1));
    return c;
  }

 private:
  bool trans_w_;
  MatmulPrecision precision_;
};

}  // namespace

bool linear_bias_applies(const Array& x, const Array& w, const Array& bias, bool trans_w) {
  if (!x.defined() || !w.defined() || !bias.defined()) return false;
  if (!is_floating(x.dtype()) || w.dtype() != x.dtype() || bias.dtype() != x.dtype()) return false;
  if (x.distributed() || w.distributed() || bias.distributed()) return false;
  if (w.ndim() != 2 || x.ndim() < 1 || bias.ndim() != 1) return false;
  return x.dim(-1) == (trans_w ? w.dim(1) : w.dim(0)) && bias.dim(0) == (trans_w ? w.dim(0) : w.dim(1));
}

Array linear_bias(const Array& x, const Array& w, const Array& bias, bool trans_w) {
  return prim::apply(std::make_shared<LinearBiasPrimitive>(trans_w, matmul_precision()), {x, w, bias});
}

}  // namespace mt
