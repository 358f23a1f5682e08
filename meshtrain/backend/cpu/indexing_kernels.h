#pragma once
// Gather / scatter-add / top-k kernels. Index arrays are i32 or i64 and have been
// validated by the caller (check_indices), so kernels never see an out-of-range index.
#include <cstdint>
#include <string>

#include "meshtrain/core/array.h"

namespace mt::cpu {

// Throws mt::Error "[op] index v out of range [0, size) ..." naming the first bad index,
// the axis size, `context` (the shapes involved). idx: any shape, i32 or i64.
void check_indices(const Array& idx, int64_t size, const char* op, const std::string& context);

// out[o, j, r] = x[o, idx[j], r].
// x: (outer, A, inner)   idx: (n_idx,) i32/i64   out: (outer, n_idx, inner), x's dtype.
void take(const Array& x, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner);

// out[o, a, r] = sum over j with idx[j] == a of upd[o, j, r]; rows never hit are zero.
// upd: (outer, n_idx, inner)   idx: (n_idx,)   out: (outer, A, inner), upd's dtype.
// Race-free: indices are grouped by destination row first, so each output row is owned by
// one task and summed in index order (deterministic whatever the thread count).
void scatter_add(const Array& upd, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner);

// torch.gather: out[c] = x[c with c[axis] := idx[c]]; idx.shape[d] <= x.shape[d] for d != axis.
// x: X-shaped   idx: I-shaped (same rank)   out: I-shaped, x's dtype.
void take_along_axis(const Array& x, const Array& idx, Array& out, int axis);

// torch.scatter_add into zeros: out[c with c[axis] := idx[c]] += upd[c].
// upd: I-shaped   idx: I-shaped   out: X-shaped, upd's dtype.
void scatter_add_along_axis(const Array& upd, const Array& idx, Array& out, int axis);

// The k largest of each line along A, descending; ties (and NaNs, ranked above every
// number) keep the lower index first.
// x: (outer, A, inner)   values: (outer, k, inner), x's dtype   indices: (outer, k, inner) i64.
void top_k(const Array& x, Array& values, Array& indices, int64_t outer, int64_t a, int64_t inner, int64_t k);

// out[..., c] = (ids[...] == c); ids validated.  ids: (n,)   out: (n, C), any dtype.
void one_hot(const Array& ids, Array& out, int64_t num_classes);

}  // namespace mt::cpu
