#include "meshtrain/ops/matmul.h"

#include <algorithm>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/cpu/matmul_kernel.h"
#include "meshtrain/core/error.h"
#include "meshtrain/dist/rules.h"
#include "meshtrain/dist/spmd.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt {

using autodiff::record;
using Grads = std::vector<Array>;

namespace {

thread_local MatmulPrecision current_precision = MatmulPrecision::f32;

cpu::MatmulDType matmul_dtype(DType d) {
  switch (d) {
    case DType::f32: return cpu::MatmulDType::f32;
    case DType::bf16: return cpu::MatmulDType::bf16;
    default: return cpu::MatmulDType::f16;
  }
}

Shape batch_shape(const Array& x) {
  std::vector<int64_t> d(x.shape().dims().begin(), x.shape().dims().end() - 2);
  return Shape(d);
}

// The product of two arrays whose batch dims are either the full broadcast batch or all 1.
Array matmul_core(const Array& a, const Array& b, bool ta, bool tb, const Shape& batch) {
  const int64_t M = ta ? a.dim(-1) : a.dim(-2), K = ta ? a.dim(-2) : a.dim(-1);
  const int64_t N = tb ? b.dim(-2) : b.dim(-1);
  std::vector<int64_t> out_dims = batch.dims();
  out_dims.push_back(M);
  out_dims.push_back(N);
  Array out = Array::empty(Shape(out_dims), a.dtype());
  const int64_t nb = batch.numel();
  const int64_t ba = batch_shape(a).numel(), bb = batch_shape(b).numel();
  const MatmulPrecision precision = current_precision;
  // Under bf16 precision the kernel rounds f32 operands to bf16 in its own staging buffers.
  const cpu::MatmulDType kernel_dtype = a.dtype() == DType::f32 && precision == MatmulPrecision::bf16
                                            ? cpu::MatmulDType::f32_as_bf16
                                            : matmul_dtype(a.dtype());
  cpu::matmul(kernel_dtype, a.raw(), b.raw(), out.raw(), nb, ba, bb, M, N, K, ta, tb);
  record(out, "matmul", {a, b}, [a, b, ta, tb, precision](const Array& g) {
    MatmulPrecisionScope scope(precision);
    Array ga, gb;
    // Each input's cotangent is a product of g with the other input, in the layout
    // (transposed or not) the input is stored in; broadcast batch dims are summed away.
    if (a.traced()) {
      ga = ta ? matmul(b, g, tb, true) : matmul(g, b, false, !tb);
      ga = sum_to(ga, a.shape());
    }
    if (b.traced()) {
      gb = tb ? matmul(g, a, true, ta) : matmul(a, g, !ta, false);
      gb = sum_to(gb, b.shape());
    }
    return Grads{ga, gb};
  });
  return out;
}

}  // namespace

MatmulPrecision matmul_precision() { return current_precision; }

MatmulPrecision matmul_precision_from_name(const std::string& name, const char* what) {
  if (name == "f32") return MatmulPrecision::f32;
  if (name == "bf16") return MatmulPrecision::bf16;
  throw Error(detail::concat("[", what, "] expected f32 or bf16, got '", name, "'"));
}

const char* matmul_precision_name(MatmulPrecision p) { return p == MatmulPrecision::bf16 ? "bf16" : "f32"; }

MatmulPrecisionScope::MatmulPrecisionScope(MatmulPrecision p) : saved_(current_precision) { current_precision = p; }
MatmulPrecisionScope::~MatmulPrecisionScope() { current_precision = saved_; }

Array matmul(const Array& a, const Array& b, bool trans_a, bool trans_b) {
  MT_CHECK(a.defined() && b.defined(), "[matmul] undefined input array");
  MT_CHECK(a.ndim() >= 2 && b.ndim() >= 2, "[matmul] expects arrays of rank >= 2, got ", a.str(), " and ", b.str());
  MT_CHECK(a.dtype() == b.dtype(), "[matmul] dtype mismatch: ", a.str(), " vs ", b.str());
  MT_CHECK(is_floating(a.dtype()), "[matmul] expects floating arrays, got ", a.str(), " and ", b.str());
  const int64_t ka = trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t kb = trans_b ? b.dim(-1) : b.dim(-2);
  MT_CHECK(ka == kb, "[matmul] contraction mismatch: ", a.str(), (trans_a ? "^T" : ""), " @ ", b.str(),
           (trans_b ? "^T" : ""), " (", ka, " vs ", kb, ")");

  if (dist::any_sharded({a, b}))
    return dist::spmd_call("matmul", {a, b}, dist::rules::matmul(trans_a, trans_b),
                           [&](const std::vector<Array>& l) { return matmul(l[0], l[1], trans_a, trans_b); });
  // A batch of activations times one weight matrix is a single large GEMM.
  if (b.ndim() == 2 && a.ndim() > 2 && !trans_a) {
    std::vector<int64_t> out_dims(a.shape().dims().begin(), a.shape().dims().end() - 1);
    out_dims.push_back(trans_b ? b.dim(0) : b.dim(1));
    Array flat = reshape(a, {-1, ka});
    return reshape(matmul_core(flat, b, false, trans_b, Shape{}), out_dims);
  }

  Shape batch = broadcast_shapes(batch_shape(a), batch_shape(b), "matmul");
  auto fit_batch = [&](const Array& x) {
    Shape xb = batch_shape(x);
    if (xb == batch || xb.numel() == 1) return x;
    std::vector<int64_t> dims = batch.dims();
    dims.push_back(x.dim(-2));
    dims.push_back(x.dim(-1));
    return broadcast_to(x, Shape(dims));
  };
  return matmul_core(fit_batch(a), fit_batch(b), trans_a, trans_b, batch);
}

}  // namespace mt
