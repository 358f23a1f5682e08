#include "meshtrain/ops/matmul.h"

#include <algorithm>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/backend/matmul.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("matmul", {"matmul"});

using layout::ArgInfo;
using layout::MeshShape;
using layout::RuleResult;
using prim::OutputInfo;
using prim::Saved;
using Grads = std::vector<Array>;
using Inputs = std::vector<Array>;

namespace {

thread_local MatmulPrecision current_precision = MatmulPrecision::f32;

Shape batch_shape(const Shape& x) {
  std::vector<int64_t> d(x.dims().begin(), x.dims().end() - 2);
  return Shape(d);
}

// A batch of activations times one weight matrix: the batch folds into M, one large GEMM.
bool folds_into_rows(const Shape& a, const Shape& b, bool ta) { return b.ndim() == 2 && a.ndim() > 2 && !ta; }

// a (..., M, K) @ b (..., K, N), either stored transposed; batch dims broadcast.
class MatmulPrimitive final : public prim::Primitive {
 public:
  MatmulPrimitive(bool ta, bool tb, MatmulPrecision precision) : ta_(ta), tb_(tb), precision_(precision) {}
  const char* name() const override { return "matmul"; }
  prim::OpKind kind() const override { return prim::OpKind::gemm; }

  OutputInfo infer(const Inputs& in) const override {
    const Array &a = in[0], &b = in[1];
    MT_CHECK(a.defined() && b.defined(), "[matmul] undefined input array");
    MT_CHECK(a.ndim() >= 2 && b.ndim() >= 2, "[matmul] expects arrays of rank >= 2, got ", a.str(), " and ", b.str());
    MT_CHECK(a.dtype() == b.dtype(), "[matmul] dtype mismatch: ", a.str(), " vs ", b.str());
    MT_CHECK(is_floating(a.dtype()), "[matmul] expects floating arrays, got ", a.str(), " and ", b.str());
    const int64_t ka = ta_ ? a.dim(-2) : a.dim(-1);
    const int64_t kb = tb_ ? b.dim(-1) : b.dim(-2);
    MT_CHECK(ka == kb, "[matmul] contraction mismatch: ", a.str(), (ta_ ? "^T" : ""), " @ ", b.str(),
             (tb_ ? "^T" : ""), " (", ka, " vs ", kb, ")");
    std::vector<int64_t> dims = broadcast_shapes(batch_shape(a.shape()), batch_shape(b.shape()), "matmul").dims();
    dims.push_back(ta_ ? a.dim(-1) : a.dim(-2));
    dims.push_back(tb_ ? b.dim(-2) : b.dim(-1));
    return {Shape(dims), a.dtype()};
  }

  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const Array& b = fit_batch(in[1], o.shape);
    const Array& a = fit_batch(in[0], o.shape);
    const int64_t K = ta_ ? a.dim(-2) : a.dim(-1), N = o.shape[o.shape.ndim() - 1];
    int64_t M = o.shape[o.shape.ndim() - 2];
    int64_t nb = batch_shape(o.shape).numel(), ba = batch_shape(a.shape()).numel(), bb = batch_shape(b.shape()).numel();
    if (folds_into_rows(a.shape(), b.shape(), ta_)) {
      M *= nb;
      nb = ba = bb = 1;
    }
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, matmul, matmul_kernel_dtype(a.dtype(), precision_), a.raw(), b.raw(), out.raw(), nb, ba, bb, M, N, K,
              ta_, tb_);
    return out;
  }

  // Each input's cotangent is a product of g with the other input, in the layout (transposed
  // or not) the input is stored in; broadcast batch dims are summed away.
  Grads vjp(const Saved& s, const Array& g) const override {
    MatmulPrecisionScope scope(precision_);
    const Array &a = s.inputs[0], &b = s.inputs[1];
    Array ga, gb;
    if (s.wants(0)) ga = sum_to(ta_ ? matmul(b, g, tb_, true) : matmul(g, b, false, !tb_), a.shape());
    if (s.wants(1)) {
      if (folds_into_rows(a.shape(), b.shape(), ta_)) {
        // One GEMM over all rows, not a batch of GEMMs summed afterwards.
        Array a2 = reshape(a, {-1, a.dim(-1)}), g2 = reshape(g, {-1, g.dim(-1)});
        gb = tb_ ? matmul(g2, a2, true, false) : matmul(a2, g2, true, false);
      } else {
        gb = sum_to(tb_ ? matmul(g, a, true, ta_) : matmul(a, g, !ta_, false), b.shape());
      }
    }
    return {ga, gb};
  }

  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::matmul(in, mesh, ta_, tb_);
  }

  bool counts_model_flops() const override { return true; }
  prim::Cost cost(const Inputs& in, const OutputInfo& o) const override {
    const int64_t K = ta_ ? in[0].dim(-2) : in[0].dim(-1);
    prim::Cost c = Primitive::cost(in, o);
    c.flops = 2.0 * double(o.shape.numel()) * double(K);
    return c;
  }

 private:
  // x with the output's batch dims, unless they are all 1 or already full (the kernel
  // broadcasts those itself).
  static Array fit_batch(const Array& x, const Shape& out) {
    const Shape batch = batch_shape(out), xb = batch_shape(x.shape());
    if (xb == batch || xb.numel() == 1) return x;
    std::vector<int64_t> dims = batch.dims();
    dims.push_back(x.dim(-2));
    dims.push_back(x.dim(-1));
    autodiff::NoGradGuard no_grad;
    return broadcast_to(x, Shape(dims));
  }

  bool ta_, tb_;
  MatmulPrecision precision_;
};

}  // namespace

MatmulPrecision matmul_precision() { return current_precision; }

kernels::MatmulDType matmul_kernel_dtype(DType operands, MatmulPrecision precision) {
  switch (operands) {
    case DType::f32:
      // Under bf16 (tf32) precision the kernel rounds f32 operands in its own staging buffers
      // (multiplies them on TF32 tensor cores).
      return precision == MatmulPrecision::bf16   ? kernels::MatmulDType::f32_as_bf16
             : precision == MatmulPrecision::tf32 ? kernels::MatmulDType::f32_as_tf32
                                                  : kernels::MatmulDType::f32;
    case DType::bf16: return kernels::MatmulDType::bf16;
    default: return kernels::MatmulDType::f16;
  }
}

MatmulPrecision matmul_precision_from_name(const std::string& name, const char* what) {
  if (name == "f32") return MatmulPrecision::f32;
  if (name == "bf16") return MatmulPrecision::bf16;
  if (name == "tf32") return MatmulPrecision::tf32;
  throw Error(detail::concat("[", what, "] expected f32, tf32 or bf16, got '", name, "'"));
}

const char* matmul_precision_name(MatmulPrecision p) {
  return p == MatmulPrecision::bf16 ? "bf16" : p == MatmulPrecision::tf32 ? "tf32" : "f32";
}

MatmulPrecisionScope::MatmulPrecisionScope(MatmulPrecision p) : saved_(current_precision) { current_precision = p; }
MatmulPrecisionScope::~MatmulPrecisionScope() { current_precision = saved_; }

Array matmul(const Array& a, const Array& b, bool trans_a, bool trans_b) {
  return prim::apply(std::make_shared<MatmulPrimitive>(trans_a, trans_b, current_precision), {a, b});
}

}  // namespace mt
