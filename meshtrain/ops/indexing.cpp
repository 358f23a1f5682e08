// Indexing primitives: take / scatter_add (along an axis with an index array), their
// elementwise-along-axis forms, embedding (with its vocabulary-parallel local form),
// one_hot and top_k's indices. Index values are validated in the kernels, on the data each
// rank holds; layouts without a dedicated rule are gathered (correct, not fast).
#include "meshtrain/ops/indexing.h"

#include <algorithm>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/indexing.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/core/error.h"
#include "meshtrain/layout/rules.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/index_checks.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("indexing", {"take", "scatter_add", "take_along_axis", "scatter_add_along_axis", "embedding", "one_hot", "top_k"});

using layout::ArgInfo;
using layout::MeshShape;
using layout::RuleResult;
using prim::OutputInfo;
using prim::Saved;
using Grads = std::vector<Array>;
using Inputs = std::vector<Array>;

namespace {

void check_defined(const Array& a, const char* op, const char* what) {
  MT_CHECK(a.defined(), "[", op, "] undefined ", what, " array");
}

void check_index_dtype(const Array& idx, const char* op) {
  MT_CHECK(idx.dtype() == DType::i32 || idx.dtype() == DType::i64, "[", op, "] indices must be i32 or i64, got ",
           idx.str());
}

// x.shape viewed as (outer, x.dim(axis), inner).
void split_at(const Shape& s, int axis, int64_t& outer, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[d];
  for (int d = axis + 1; d < s.ndim(); ++d) inner *= s[d];
}

// shape[:axis] + mid + shape[axis+1:]
Shape splice(const Shape& s, int axis, const Shape& mid) {
  std::vector<int64_t> dims(s.dims().begin(), s.dims().begin() + axis);
  dims.insert(dims.end(), mid.dims().begin(), mid.dims().end());
  dims.insert(dims.end(), s.dims().begin() + axis + 1, s.dims().end());
  return Shape(std::move(dims));
}

// Rank and per-dimension bounds shared by take_along_axis and its adjoint.
void check_along_axis_shapes(const Shape& x, const Array& idx, int axis, const char* op) {
  MT_CHECK(idx.ndim() == x.ndim(), "[", op, "] indices ", idx.str(), " must have the rank of ", x.str());
  for (int d = 0; d < x.ndim(); ++d)
    MT_CHECK(d == axis || idx.shape()[d] <= x[d], "[", op, "] indices ", idx.str(), " exceed ", x.str(),
             " in dimension ", d, " (only axis ", axis, " may differ freely)");
}


// The value differentiates; the indices (input 1) only steer.
class IndexPrimitive : public prim::Primitive {
 public:
  explicit IndexPrimitive(int axis) : axis_(axis) {}
  uint32_t keeps_inputs() const override { return 2u; }

 protected:
  int axis_;
};

class TakePrimitive final : public IndexPrimitive {
 public:
  using IndexPrimitive::IndexPrimitive;
  const char* name() const override { return "take"; }
  OutputInfo infer(const Inputs& in) const override {
    return {splice(in[0].shape(), axis_, in[1].shape()), in[0].dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const Array& x = in[0];
    const int64_t a = x.shape()[axis_];
    const Array indices = checked_indices(
        in[1], a, "take", index_range_message("take", a, in[1].shape(), [d = x.dtype(), s = x.shape(), axis = axis_] {
          return detail::concat("x ", dtype_name(d), s.str(), ", axis ", axis);
        }));
    int64_t outer, inner;
    split_at(x.shape(), axis_, outer, inner);
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, take, x, indices, out, outer, x.shape()[axis_], inner);
    return out;
  }
  Grads vjp(const Saved& s, const Array& g) const override {
    return {scatter_add(s.shapes[0], s.inputs[1], g, axis_), Array()};
  }
};

// Inputs (updates, indices): zeros of `shape` with updates summed in at the indices.
class ScatterAddPrimitive final : public IndexPrimitive {
 public:
  ScatterAddPrimitive(Shape shape, int axis) : IndexPrimitive(axis), shape_(std::move(shape)) {}
  const char* name() const override { return "scatter_add"; }
  OutputInfo infer(const Inputs& in) const override {
    const Array &updates = in[0], &indices = in[1];
    Shape expected = splice(shape_, axis_, indices.shape());
    MT_CHECK(updates.shape() == expected, "[scatter_add] updates ", updates.str(), " must have shape ",
             expected.str(), " to scatter indices ", indices.shape().str(), " into ", shape_.str(), " along axis ",
             axis_);
    return {shape_, updates.dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const int64_t a = shape_[axis_];
    const Array indices =
        checked_indices(in[1], a, "scatter_add",
                        index_range_message("scatter_add", a, in[1].shape(), [s = shape_, axis = axis_] {
                          return detail::concat("target shape ", s.str(), ", axis ", axis);
                        }));
    int64_t outer, inner;
    split_at(shape_, axis_, outer, inner);
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, scatter_add, in[0], indices, out, outer, a, inner);
    return out;
  }
  Grads vjp(const Saved& s, const Array& g) const override { return {take(g, s.inputs[1], axis_), Array()}; }

 private:
  Shape shape_;
};

class TakeAlongAxisPrimitive final : public IndexPrimitive {
 public:
  using IndexPrimitive::IndexPrimitive;
  const char* name() const override { return "take_along_axis"; }
  OutputInfo infer(const Inputs& in) const override {
    check_along_axis_shapes(in[0].shape(), in[1], axis_, "take_along_axis");
    return {in[1].shape(), in[0].dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const Array& x = in[0];
    const int64_t a = x.shape()[axis_];
    const Array indices =
        checked_indices(in[1], a, "take_along_axis",
                        index_range_message("take_along_axis", a, in[1].shape(),
                                            [d = x.dtype(), s = x.shape(), axis = axis_] {
                                              return detail::concat("x ", dtype_name(d), s.str(), ", axis ", axis);
                                            }));
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, take_along_axis, x, indices, out, axis_);
    return out;
  }
  Grads vjp(const Saved& s, const Array& g) const override {
    return {scatter_add_along_axis(s.shapes[0], s.inputs[1], g, axis_), Array()};
  }
};

class ScatterAddAlongAxisPrimitive final : public IndexPrimitive {
 public:
  ScatterAddAlongAxisPrimitive(Shape shape, int axis) : IndexPrimitive(axis), shape_(std::move(shape)) {}
  const char* name() const override { return "scatter_add_along_axis"; }
  OutputInfo infer(const Inputs& in) const override {
    const Array &updates = in[0], &indices = in[1];
    MT_CHECK(updates.shape() == indices.shape(), "[scatter_add_along_axis] updates ", updates.str(), " and indices ",
             indices.str(), " must have the same shape");
    check_along_axis_shapes(shape_, indices, axis_, "scatter_add_along_axis");
    return {shape_, updates.dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const int64_t a = shape_[axis_];
    const Array indices =
        checked_indices(in[1], a, "scatter_add_along_axis",
                        index_range_message("scatter_add_along_axis", a, in[1].shape(), [s = shape_, axis = axis_] {
                          return detail::concat("target shape ", s.str(), ", axis ", axis);
                        }));
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, scatter_add_along_axis, in[0], indices, out, axis_);
    return out;
  }
  Grads vjp(const Saved& s, const Array& g) const override {
    return {take_along_axis(g, s.inputs[1], axis_), Array()};
  }

 private:
  Shape shape_;
};

// embedding(table (V, D), ids) -> ids.shape + (D,). On a rank holding rows
// [row_offset, row_offset + V_local) of a vocabulary-split table, ids outside that range
// give zero rows (the consumer sums the partial results: one all-reduce). With a padding id
// (nn.Embedding's padding_idx) the positions holding it pass no gradient to the table; only
// the backward's mask changes, so the forward costs nothing more.
class EmbeddingPrimitive final : public prim::Primitive {
 public:
  explicit EmbeddingPrimitive(int64_t padding_idx = -1) : padding_idx_(padding_idx) {}
  EmbeddingPrimitive(int64_t row_offset, int64_t vocab, int64_t padding_idx)
      : row_offset_(row_offset), vocab_(vocab), padding_idx_(padding_idx), masked_(true) {}
  const char* name() const override { return "embedding"; }
  OutputInfo infer(const Inputs& in) const override {
    std::vector<int64_t> dims = in[1].shape().dims();
    dims.push_back(in[0].dim(1));
    return {Shape(dims), in[0].dtype()};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs& aux) const override {
    const Array& table = in[0];
    const int64_t v = table.dim(0), d = table.dim(1);
    Array out = Array::empty(o.shape, o.dtype);
    if (!masked_) {
      const Array ids = checked_indices(in[1], v, "embedding",
                                        index_range_message("embedding", v, in[1].shape(), [d = table.dtype(), s = table.shape()] {
                                          return "table " + std::string(dtype_name(d)) + s.str();
                                        }));
      MT_KERNEL(out, take, table, ids, out, 1, v, d);
      return out;
    }
    const Array ids =
        checked_indices(in[1], vocab_, "embedding",
                        index_range_message("embedding", vocab_, in[1].shape(), [vocab = vocab_, d] {
                          return detail::concat("table (", vocab, ", ", d, ")");
                        }));
    // Local row of each id (0 where another rank holds it) and whether this rank holds it,
    // formed with device ops: the ids are never read to the host.
    autodiff::NoGradGuard no_grad;
    const Array row = sub(ids, scalar_like(ids, double(row_offset_)));
    const Array held = logical_and(ge(row, scalar_like(row, 0.0)), lt(row, scalar_like(row, double(v))));
    const Array local_ids = where(held, row, scalar_like(row, 0.0));
    const Array mask = cast(held, table.dtype());
    MT_KERNEL(out, take, table, local_ids, out, 1, v, d);
    out = mul(out, expand_dims(mask, -1));
    // The backward's mask: the rows this rank holds, less the padding positions.
    const Array trained =
        padding_idx_ < 0 ? mask : mul(mask, cast(ne(ids, scalar_like(ids, double(padding_idx_))), table.dtype()));
    aux = {local_ids, trained};
    return out;
  }
  uint32_t keeps_inputs() const override { return masked_ ? 0u : 2u; }
  Grads vjp(const Saved& s, const Array& g) const override {
    // Row-owned scatter (see cpu::scatter_add): safe and deterministic under OpenMP.
    if (masked_) return {scatter_add(s.shapes[0], s.aux[0], mul(g, expand_dims(s.aux[1], -1)), 0), Array()};
    if (padding_idx_ < 0) return {scatter_add(s.shapes[0], s.inputs[1], g, 0), Array()};
    const Array& ids = s.inputs[1];
    const Array trained = expand_dims(cast(ne(ids, scalar_like(ids, double(padding_idx_))), g.dtype()), -1);
    return {scatter_add(s.shapes[0], ids, mul(g, trained), 0), Array()};
  }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::embedding(in, mesh);
  }
  prim::PrimitivePtr localize(const prim::LocalContext& ctx, const prim::PrimitivePtr& self) const override {
    if (ctx.input_specs[0].axes_of(0).empty()) return self;
    return std::make_shared<EmbeddingPrimitive>(ctx.input_offsets[0][0], ctx.input_global[0][0], padding_idx_);
  }

 private:
  int64_t row_offset_ = 0, vocab_ = 0;
  int64_t padding_idx_ = -1;  // -1: none
  bool masked_ = false;
};

class OneHotPrimitive final : public prim::Primitive {
 public:
  OneHotPrimitive(int64_t num_classes, DType dtype) : num_classes_(num_classes), dtype_(dtype) {}
  const char* name() const override { return "one_hot"; }
  OutputInfo infer(const Inputs& in) const override {
    std::vector<int64_t> dims = in[0].shape().dims();
    dims.push_back(num_classes_);
    return {Shape(dims), dtype_};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const Array ids =
        checked_indices(in[0], num_classes_, "one_hot",
                        index_range_message("one_hot", num_classes_, in[0].shape(),
                                            [n = num_classes_] { return detail::concat("num_classes ", n); }));
    Array out = Array::empty(o.shape, o.dtype);
    MT_KERNEL(out, one_hot, ids, out, num_classes_);
    return out;
  }
  bool differentiable(const Inputs&, const OutputInfo&) const override { return false; }
  RuleResult sharding(const std::vector<ArgInfo>& in, const MeshShape& mesh) const override {
    return layout::rules::gather_dims(in, mesh, {});
  }

 private:
  int64_t num_classes_;
  DType dtype_;
};

// The indices of the k largest values along `axis`, largest first (ties: lower index first).
class TopKIndicesPrimitive final : public prim::Primitive {
 public:
  TopKIndicesPrimitive(int64_t k, int axis) : k_(k), axis_(axis) {}
  const char* name() const override { return "top_k"; }
  OutputInfo infer(const Inputs& in) const override {
    std::vector<int64_t> dims = in[0].shape().dims();
    dims[size_t(axis_)] = k_;
    return {Shape(dims), DType::i64};
  }
  Array run(const Inputs& in, const OutputInfo& o, Inputs&) const override {
    const Array& x = in[0];
    int64_t outer, inner;
    split_at(x.shape(), axis_, outer, inner);
    Array values = Array::empty(o.shape, x.dtype());
    Array indices = Array::empty(o.shape, DType::i64);
    MT_KERNEL(x, top_k, x, values, indices, outer, x.shape()[axis_], inner, k_);
    return indices;
  }

 private:
  int64_t k_;
  int axis_;
};

}  // namespace

Array take(const Array& x, const Array& indices, int axis) {
  check_defined(x, "take", "input");
  check_defined(indices, "take", "indices");
  MT_CHECK(x.ndim() >= 1, "[take] cannot index a 0-d array ", x.str());
  check_index_dtype(indices, "take");
  axis = x.shape().axis(axis, "take");
  return prim::apply(std::make_shared<TakePrimitive>(axis), {x, indices});
}

Array scatter_add(const Shape& shape, const Array& indices, const Array& updates, int axis) {
  check_defined(indices, "scatter_add", "indices");
  check_defined(updates, "scatter_add", "updates");
  MT_CHECK(shape.ndim() >= 1, "[scatter_add] cannot scatter into a 0-d shape ", shape.str());
  MT_CHECK(updates.dtype() != DType::boolean, "[scatter_add] cannot sum bool updates ", updates.str());
  check_index_dtype(indices, "scatter_add");
  axis = shape.axis(axis, "scatter_add");
  return prim::apply(std::make_shared<ScatterAddPrimitive>(shape, axis), {updates, indices});
}

Array take_along_axis(const Array& x, const Array& indices, int axis) {
  check_defined(x, "take_along_axis", "input");
  check_defined(indices, "take_along_axis", "indices");
  MT_CHECK(x.ndim() >= 1, "[take_along_axis] cannot index a 0-d array ", x.str());
  check_index_dtype(indices, "take_along_axis");
  axis = x.shape().axis(axis, "take_along_axis");
  return prim::apply(std::make_shared<TakeAlongAxisPrimitive>(axis), {x, indices});
}

Array scatter_add_along_axis(const Shape& shape, const Array& indices, const Array& updates, int axis) {
  const char* op = "scatter_add_along_axis";
  check_defined(indices, op, "indices");
  check_defined(updates, op, "updates");
  MT_CHECK(shape.ndim() >= 1, "[", op, "] cannot scatter into a 0-d shape ", shape.str());
  MT_CHECK(updates.dtype() != DType::boolean, "[", op, "] cannot sum bool updates ", updates.str());
  check_index_dtype(indices, op);
  axis = shape.axis(axis, op);
  return prim::apply(std::make_shared<ScatterAddAlongAxisPrimitive>(shape, axis), {updates, indices});
}

namespace {

// The sharding rule gathers a table split over axes that also split the ids (FSDP's data
// axis), and the table's whole gradient then comes back to be reduce-scattered: V × D
// elements each way, and a whole table and a whole gradient on every rank. With fewer ids
// than table rows (GPT-2 Large under FSDP: 1,024 ids, 50,257 rows), the ids are gathered
// instead: each rank looks its block of the table up for every id, the result moves to the
// layout the rule would have given (N × D elements each way), and the table's gradient is
// made in the rank's own block. Undefined when that route does not apply.
Array embedding_by_gathered_ids(const prim::PrimitivePtr& p, const Array& table, const Array& ids) {
  const prim::DistributedExecutor* executor = prim::distributed_executor();
  if (!executor || !table.distributed() || !ids.distributed() || ids.numel() >= table.dim(0)) return Array();
  const layout::PartitionSpec ts = prim::spec_of(table), is = prim::spec_of(ids);
  if (!ts.partial.empty() || !is.partial.empty()) return Array();
  const std::vector<std::string> id_axes = is.used_axes(), table_axes = ts.used_axes();
  auto splits_ids = [&](const std::string& axis) {
    return std::find(id_axes.begin(), id_axes.end(), axis) != id_axes.end();
  };
  // Only a table split over the ids' axes alone (FSDP); tensor-parallel tables keep the rule.
  if (table_axes.empty() || !std::all_of(table_axes.begin(), table_axes.end(), splits_ids)) return Array();
  const layout::MeshShape mesh = prim::mesh_shape_of(ids);
  // Gathered ids would be plain: the executor's check that both live on one mesh is kept.
  if (!(mesh == prim::mesh_shape_of(table))) return Array();
  const layout::PartitionSpec target =
      layout::rules::embedding({{table.shape(), ts, table.dtype(), true}, {ids.shape(), is, ids.dtype(), true}}, mesh)
          .output;
  const Array gathered_ids = executor->redistribute(ids, is.padded(ids.ndim()).without_axes(table_axes));
  const Array looked_up = prim::apply(p, {table, gathered_ids});
  return executor->redistribute(looked_up, target);
}

}  // namespace

Array embedding(const Array& table, const Array& ids, std::optional<int64_t> padding_idx) {
  check_defined(table, "embedding", "table");
  check_defined(ids, "embedding", "ids");
  MT_CHECK(table.ndim() == 2, "[embedding] table must be (V, D), got ", table.str());
  check_index_dtype(ids, "embedding");
  MT_CHECK(!padding_idx || *padding_idx >= 0, "[embedding] padding_idx must be >= 0, got ", padding_idx.value_or(0));
  const prim::PrimitivePtr p = padding_idx ? std::make_shared<EmbeddingPrimitive>(*padding_idx)
                                           : prim::instance<EmbeddingPrimitive>();
  if (Array out = embedding_by_gathered_ids(p, table, ids); out.defined()) return out;
  return prim::apply(p, {table, ids});
}

Array one_hot(const Array& ids, int64_t num_classes, DType dtype) {
  check_defined(ids, "one_hot", "ids");
  check_index_dtype(ids, "one_hot");
  MT_CHECK(num_classes > 0, "[one_hot] num_classes must be positive, got ", num_classes);
  return prim::apply(std::make_shared<OneHotPrimitive>(num_classes, dtype), {ids});
}

std::pair<Array, Array> top_k(const Array& x, int64_t k, int axis) {
  check_defined(x, "top_k", "input");
  MT_CHECK(x.ndim() >= 1, "[top_k] expects rank >= 1, got ", x.str());
  MT_CHECK(x.dtype() != DType::boolean, "[top_k] cannot rank bool array ", x.str());
  axis = x.shape().axis(axis, "top_k");
  const int64_t a = x.shape()[axis];
  MT_CHECK(k >= 0 && k <= a, "[top_k] k = ", k, " out of range [0, ", a, "] for axis ", axis, " of ", x.str());
  Array indices = prim::apply(std::make_shared<TopKIndicesPrimitive>(k, axis), {x});
  // The values are a gather of x, so they differentiate through take_along_axis.
  return {take_along_axis(x, indices, axis), indices};
}

}  // namespace mt
