#include "meshtrain/ops/indexing.h"

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/cpu/indexing_kernels.h"
#include "meshtrain/core/error.h"
#include "meshtrain/dist/rules.h"
#include "meshtrain/dist/spmd.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/ops/elementwise.h"

namespace mt {

using autodiff::record;
using Grads = std::vector<Array>;

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

}  // namespace

Array take(const Array& x, const Array& indices, int axis) {
  // No layout-aware rule yet: gather to every rank (correct, not fast).
  if (dist::any_sharded({x, indices})) return take(dist::to_host(x), dist::to_host(indices), axis);
  check_defined(x, "take", "input");
  check_defined(indices, "take", "indices");
  MT_CHECK(x.ndim() >= 1, "[take] cannot index a 0-d array ", x.str());
  check_index_dtype(indices, "take");
  axis = x.shape().axis(axis, "take");
  cpu::check_indices(indices, x.shape()[axis], "take", detail::concat("x ", x.str(), ", axis ", axis));
  int64_t outer, inner;
  split_at(x.shape(), axis, outer, inner);
  Array out = Array::empty(splice(x.shape(), axis, indices.shape()), x.dtype());
  cpu::take(x, indices, out, outer, x.shape()[axis], inner);
  if (is_floating(x.dtype()))
    record(out, "take", {x},
           [indices, s = x.shape(), axis](const Array& g) { return Grads{scatter_add(s, indices, g, axis)}; });
  return out;
}

Array scatter_add(const Shape& shape, const Array& indices, const Array& updates, int axis) {
  // No layout-aware rule yet: gather to every rank (correct, not fast).
  if (dist::any_sharded({indices, updates})) return scatter_add(shape, dist::to_host(indices), dist::to_host(updates), axis);
  check_defined(indices, "scatter_add", "indices");
  check_defined(updates, "scatter_add", "updates");
  MT_CHECK(shape.ndim() >= 1, "[scatter_add] cannot scatter into a 0-d shape ", shape.str());
  MT_CHECK(updates.dtype() != DType::boolean, "[scatter_add] cannot sum bool updates ", updates.str());
  check_index_dtype(indices, "scatter_add");
  axis = shape.axis(axis, "scatter_add");
  Shape expected = splice(shape, axis, indices.shape());
  MT_CHECK(updates.shape() == expected, "[scatter_add] updates ", updates.str(), " must have shape ", expected.str(),
           " to scatter indices ", indices.shape().str(), " into ", shape.str(), " along axis ", axis);
  cpu::check_indices(indices, shape[axis], "scatter_add",
                     detail::concat("target shape ", shape.str(), ", axis ", axis));
  int64_t outer, inner;
  split_at(shape, axis, outer, inner);
  Array out = Array::empty(shape, updates.dtype());
  cpu::scatter_add(updates, indices, out, outer, shape[axis], inner);
  if (is_floating(out.dtype()))
    record(out, "scatter_add", {updates}, [indices, axis](const Array& g) { return Grads{take(g, indices, axis)}; });
  return out;
}

Array take_along_axis(const Array& x, const Array& indices, int axis) {
  // No layout-aware rule yet: gather to every rank (correct, not fast).
  if (dist::any_sharded({x, indices})) return take_along_axis(dist::to_host(x), dist::to_host(indices), axis);
  check_defined(x, "take_along_axis", "input");
  check_defined(indices, "take_along_axis", "indices");
  MT_CHECK(x.ndim() >= 1, "[take_along_axis] cannot index a 0-d array ", x.str());
  check_index_dtype(indices, "take_along_axis");
  axis = x.shape().axis(axis, "take_along_axis");
  check_along_axis_shapes(x.shape(), indices, axis, "take_along_axis");
  cpu::check_indices(indices, x.shape()[axis], "take_along_axis", detail::concat("x ", x.str(), ", axis ", axis));
  Array out = Array::empty(indices.shape(), x.dtype());
  cpu::take_along_axis(x, indices, out, axis);
  if (is_floating(x.dtype()))
    record(out, "take_along_axis", {x}, [indices, s = x.shape(), axis](const Array& g) {
      return Grads{scatter_add_along_axis(s, indices, g, axis)};
    });
  return out;
}

Array scatter_add_along_axis(const Shape& shape, const Array& indices, const Array& updates, int axis) {
  // No layout-aware rule yet: gather to every rank (correct, not fast).
  if (dist::any_sharded({indices, updates})) return scatter_add_along_axis(shape, dist::to_host(indices), dist::to_host(updates), axis);
  const char* op = "scatter_add_along_axis";
  check_defined(indices, op, "indices");
  check_defined(updates, op, "updates");
  MT_CHECK(shape.ndim() >= 1, "[", op, "] cannot scatter into a 0-d shape ", shape.str());
  MT_CHECK(updates.dtype() != DType::boolean, "[", op, "] cannot sum bool updates ", updates.str());
  check_index_dtype(indices, op);
  axis = shape.axis(axis, op);
  MT_CHECK(updates.shape() == indices.shape(), "[", op, "] updates ", updates.str(), " and indices ", indices.str(),
           " must have the same shape");
  check_along_axis_shapes(shape, indices, axis, op);
  cpu::check_indices(indices, shape[axis], op, detail::concat("target shape ", shape.str(), ", axis ", axis));
  Array out = Array::empty(shape, updates.dtype());
  cpu::scatter_add_along_axis(updates, indices, out, axis);
  if (is_floating(out.dtype()))
    record(out, op, {updates}, [indices, axis](const Array& g) { return Grads{take_along_axis(g, indices, axis)}; });
  return out;
}

namespace {
// A table split over its vocabulary: each rank looks up the ids it holds rows for (others
// give zero rows) and the partial results are summed by the consumer (one all-reduce).
Array vocab_parallel_embedding(const Array& table, const Array& ids) {
  const dist::Sharding* ts = dist::sharding_of(table);
  int64_t row_offset = 0;
  if (ts && dist::is_sharded(table) && !ts->spec.axes_of(0).empty())
    row_offset = ts->block_index(0) * (table.dim(0) / ts->num_blocks(0));
  return dist::spmd_call("embedding", {table, ids}, dist::rules::embedding(), [&](const std::vector<Array>& l) {
    const Array& tl = l[0];
    if (tl.dim(0) == table.dim(0)) return embedding(tl, l[1]);
    Array shifted = sub(l[1], Array::scalar(double(row_offset), l[1].dtype()));
    Array valid = logical_and(ge(shifted, zeros_like(shifted)), lt(shifted, Array::scalar(double(tl.dim(0)), l[1].dtype())));
    Array safe = where(valid, shifted, zeros_like(shifted));
    return mul(embedding(tl, safe), expand_dims(cast(valid, tl.dtype()), -1));
  });
}
}  // namespace

Array embedding(const Array& table, const Array& ids) {
  check_defined(table, "embedding", "table");
  check_defined(ids, "embedding", "ids");
  MT_CHECK(table.ndim() == 2, "[embedding] table must be (V, D), got ", table.str());
  if (dist::any_sharded({table, ids})) return vocab_parallel_embedding(table, ids);
  check_index_dtype(ids, "embedding");
  const int64_t v = table.shape()[0], d = table.shape()[1];
  cpu::check_indices(ids, v, "embedding", detail::concat("table ", table.str()));
  std::vector<int64_t> dims = ids.shape().dims();
  dims.push_back(d);
  Array out = Array::empty(Shape(std::move(dims)), table.dtype());
  cpu::take(table, ids, out, 1, v, d);
  if (is_floating(table.dtype()))
    record(out, "embedding", {table}, [ids, s = table.shape()](const Array& g) {
      // Row-owned scatter (see cpu::scatter_add): safe and deterministic under OpenMP.
      return Grads{scatter_add(s, ids, g, 0)};
    });
  return out;
}

Array one_hot(const Array& ids, int64_t num_classes, DType dtype) {
  check_defined(ids, "one_hot", "ids");
  if (dist::is_sharded(ids))
    return dist::spmd_call("one_hot", {ids}, dist::rules::gather_dims({}),
                           [&](const std::vector<Array>& l) { return one_hot(l[0], num_classes, dtype); });
  check_index_dtype(ids, "one_hot");
  MT_CHECK(num_classes > 0, "[one_hot] num_classes must be positive, got ", num_classes);
  cpu::check_indices(ids, num_classes, "one_hot", detail::concat("num_classes ", num_classes));
  std::vector<int64_t> dims = ids.shape().dims();
  dims.push_back(num_classes);
  Array out = Array::empty(Shape(std::move(dims)), dtype);
  cpu::one_hot(ids, out, num_classes);
  return out;
}

std::pair<Array, Array> top_k(const Array& x, int64_t k, int axis) {
  check_defined(x, "top_k", "input");
  if (dist::is_sharded(x)) return top_k(dist::to_host(x), k, axis);
  MT_CHECK(x.ndim() >= 1, "[top_k] expects rank >= 1, got ", x.str());
  MT_CHECK(x.dtype() != DType::boolean, "[top_k] cannot rank bool array ", x.str());
  axis = x.shape().axis(axis, "top_k");
  const int64_t a = x.shape()[axis];
  MT_CHECK(k >= 0 && k <= a, "[top_k] k = ", k, " out of range [0, ", a, "] for axis ", axis, " of ", x.str());
  int64_t outer, inner;
  split_at(x.shape(), axis, outer, inner);
  std::vector<int64_t> dims = x.shape().dims();
  dims[size_t(axis)] = k;
  Array values = Array::empty(Shape(dims), x.dtype());
  Array indices = Array::empty(Shape(dims), DType::i64);
  cpu::top_k(x, values, indices, outer, a, inner, k);
  if (is_floating(x.dtype()))
    record(values, "top_k", {x}, [indices, s = x.shape(), axis](const Array& g) {
      return Grads{scatter_add_along_axis(s, indices, g, axis)};
    });
  return {values, indices};
}

}  // namespace mt
