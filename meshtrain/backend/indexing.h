#pragma once
// Gather / scatter-add / top-k kernels: cpu/indexing.cpp and cuda/indexing.cu. Index arrays are
// i32 or i64 and have been validated by the caller (check_indices), so kernels never see an
// out-of-range index.
#include <cstdint>
#include <string>

#include "meshtrain/core/array.h"

// check_indices: throws mt::Error "[op] index v out of range [0, size) ..." naming the first bad
//   index, the axis size, `context` (the shapes involved). idx: any shape, i32 or i64.
// take: out[o, j, r] = x[o, idx[j], r]. x (outer, A, inner); idx (n_idx,); out (outer, n_idx,
//   inner) in x's dtype.
// scatter_add: out[o, a, r] = Σ over j with idx[j] == a of upd[o, j, r]; rows never hit are zero.
//   upd (outer, n_idx, inner); out (outer, A, inner) in upd's dtype. Race-free: indices are
//   grouped by destination row first, so each output row is owned by one task and summed in
//   index order (deterministic whatever the thread count).
// take_along_axis (torch.gather): out[c] = x[c with c[axis] := idx[c]]; idx.shape[d] <= x.shape[d]
//   for d != axis; out is idx-shaped in x's dtype.
// scatter_add_along_axis (torch.scatter_add into zeros): out[c with c[axis] := idx[c]] += upd[c];
//   out is x-shaped in upd's dtype.
// top_k: the k largest of each line along A, descending; ties (and NaNs, ranked above every
//   number) keep the lower index first. x (outer, A, inner); values (outer, k, inner) in x's
//   dtype; indices (outer, k, inner) i64.
// one_hot: out[..., c] = (ids[...] == c); ids (n,) validated; out (n, C), any dtype.
#define MT_INDEXING_KERNELS                                                                                   \
  void check_indices(const Array& idx, int64_t size, const char* op, const std::string& context);             \
  void take(const Array& x, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner);           \
  void scatter_add(const Array& upd, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner);  \
  void take_along_axis(const Array& x, const Array& idx, Array& out, int axis);                               \
  void scatter_add_along_axis(const Array& upd, const Array& idx, Array& out, int axis);                      \
  void top_k(const Array& x, Array& values, Array& indices, int64_t outer, int64_t a, int64_t inner,         \
             int64_t k);                                                                                      \
  void one_hot(const Array& ids, Array& out, int64_t num_classes);

namespace mt::cpu { MT_INDEXING_KERNELS }
namespace mt::cuda { MT_INDEXING_KERNELS }
