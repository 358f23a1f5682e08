#pragma once
// Gather / scatter-add / top-k kernels: cpu/indexing.cpp and cuda/indexing.cu. Index arrays are
// i32 or i64 and have been validated by the caller (ops/index_checks.h: index_verdict, its
// verdict read at once or, inside a deferred-check scope, with the step's loss, the kernels then
// reading a copy with the bad entries zeroed), so kernels never see an out-of-range index.
#include <cstdint>
#include <string>

#include "meshtrain/core/array.h"

namespace mt {
// index_verdict's "every index is in range".
inline constexpr int64_t kNoBadIndex = INT64_MAX;
}  // namespace mt

// index_verdict: first (an i64 scalar on idx's device) = the smallest flat position j with
//   idx[j] outside [0, size) and idx[j] != skip, or kNoBadIndex (INT64_MAX) when there is none;
//   written, never read here. With `safe` (idx-shaped, idx's dtype): safe = idx with those
//   entries replaced by 0. idx: any shape, i32 or i64 (another dtype is an error naming `op`).
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
  void index_verdict(const Array& idx, int64_t size, int64_t skip, Array& first, Array* safe, const char* op); \
  void take(const Array& x, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner);           \
  void scatter_add(const Array& upd, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner);  \
  void take_along_axis(const Array& x, const Array& idx, Array& out, int axis);                               \
  void scatter_add_along_axis(const Array& upd, const Array& idx, Array& out, int axis);                      \
  void top_k(const Array& x, Array& values, Array& indices, int64_t outer, int64_t a, int64_t inner,         \
             int64_t k);                                                                                      \
  void one_hot(const Array& ids, Array& out, int64_t num_classes);

namespace mt::cpu { MT_INDEXING_KERNELS }
namespace mt::cuda { MT_INDEXING_KERNELS }
