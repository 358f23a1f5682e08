// Reductions of x viewed as (outer, R, inner) along R. Floating sums accumulate in double, as
// the CPU kernel does, so long reductions agree to the f32 rounding of the result.
#include <algorithm>
#include <cfloat>

#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/reduce.h"

namespace mt::cuda {

using kernels::ReduceOp;

namespace {

template <class T>
using acc_t = std::conditional_t<is_float_v<T>, double, int64_t>;

template <class A>
__device__ inline A reduce_init(ReduceOp op) {
  if (op == ReduceOp::sum) return A(0);
  if constexpr (std::is_same_v<A, double>) return op == ReduceOp::max ? -INFINITY : INFINITY;
  else return op == ReduceOp::max ? INT64_MIN : INT64_MAX;
}
template <class A>
__device__ inline A reduce_combine(ReduceOp op, A a, A v) {
  if (op == ReduceOp::sum) return a + v;
  if constexpr (std::is_same_v<A, double>) {
    if (isnan(v) || isnan(a)) return NAN;
  }
  return op == ReduceOp::max ? (v > a ? v : a) : (v < a ? v : a);
}
template <class T, class A>
__device__ inline T reduce_store(A v) {
  if constexpr (is_float_v<T>) return from_f32<T>(float(v));
  else if constexpr (std::is_same_v<T, bool>) return v != 0;
  else return T(v);
}
template <class T>
__device__ inline acc_t<T> reduce_load(T v) {
  if constexpr (is_float_v<T>) return double(to_f32(v));
  else return int64_t(v);
}

// inner == 1: one block per row, threads stride along R, then a tree over the block.
template <class T>
__global__ void reduce_rows_kernel(ReduceOp op, const T* x, T* out, int64_t r) {
  using A = acc_t<T>;
  __shared__ A partial[kThreads];
  const T* row = x + int64_t(blockIdx.x) * r;
  A acc = reduce_init<A>(op);
  for (int64_t k = threadIdx.x; k < r; k += blockDim.x) acc = reduce_combine(op, acc, reduce_load(row[k]));
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) partial[threadIdx.x] = reduce_combine(op, partial[threadIdx.x], partial[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = reduce_store<T>(partial[0]);
}

// inner > 1: one thread per (outer, inner) column, reading along R (coalesced across inner).
template <class T>
__global__ void reduce_columns_kernel(ReduceOp op, const T* x, T* out, int64_t outer, int64_t r, int64_t inner) {
  using A = acc_t<T>;
  MT_GRID_LOOP(c, outer * inner) {
    const int64_t o = c / inner, i = c % inner;
    A acc = reduce_init<A>(op);
    for (int64_t k = 0; k < r; ++k) acc = reduce_combine(op, acc, reduce_load(x[(o * r + k) * inner + i]));
    out[c] = reduce_store<T>(acc);
  }
}

// inner > 1 with few columns (a bias gradient: (rows, C) summed over rows): R is split into
// `splits` chunks so the GPU has enough blocks; each block writes one partial per column.
template <class T>
__global__ void reduce_columns_partial_kernel(ReduceOp op, const T* x, acc_t<T>* part, int64_t outer, int64_t r,
                                              int64_t inner, int64_t chunk) {
  using A = acc_t<T>;
  const int64_t cols = outer * inner;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t o = c / inner, i = c % inner, k0 = int64_t(blockIdx.y) * chunk, k1 = min(r, k0 + chunk);
  A acc = reduce_init<A>(op);
  for (int64_t k = k0; k < k1; ++k) acc = reduce_combine(op, acc, reduce_load(x[(o * r + k) * inner + i]));
  part[int64_t(blockIdx.y) * cols + c] = acc;
}
// The partials of each column combined in chunk order (deterministic).
template <class T>
__global__ void reduce_partials_kernel(ReduceOp op, const acc_t<T>* part, T* out, int64_t cols, int64_t splits) {
  using A = acc_t<T>;
  MT_GRID_LOOP(c, cols) {
    A acc = reduce_init<A>(op);
    for (int64_t j = 0; j < splits; ++j) acc = reduce_combine(op, acc, part[j * cols + c]);
    out[c] = reduce_store<T>(acc);
  }
}

// The first maximum along R; a NaN wins at its position (torch.argmax).
template <class T>
__global__ void argmax_kernel(const T* x, int64_t* out, int64_t outer, int64_t r, int64_t inner) {
  MT_GRID_LOOP(c, outer * inner) {
    const int64_t o = c / inner, i = c % inner;
    int64_t best = 0;
    double best_v = -INFINITY;
    for (int64_t k = 0; k < r; ++k) {
      const double v = load_double(x[(o * r + k) * inner + i]);
      if (isnan(v)) {
        best = k;
        break;
      }
      if (k == 0 || v > best_v) {
        best_v = v;
        best = k;
      }
    }
    out[c] = best;
  }
}

// inner == 1 and long rows: a block per row. Candidates are ordered as the sequential scan
// decides: a NaN beats every number, then the larger value; ties keep the lower index.
struct ArgBest {
  double v;
  int64_t k;  // INT64_MAX: none yet
  bool nan;
};
__device__ inline bool beats(const ArgBest& b, const ArgBest& a) {
  if (b.k == INT64_MAX) return false;
  if (a.k == INT64_MAX) return true;
  if (b.nan != a.nan) return b.nan;
  if (!b.nan && b.v != a.v) return b.v > a.v;
  return b.k < a.k;
}
template <class T>
__global__ void argmax_rows_kernel(const T* x, int64_t* out, int64_t r) {
  __shared__ ArgBest best[kThreads];
  const T* row = x + int64_t(blockIdx.x) * r;
  ArgBest mine{0.0, INT64_MAX, false};
  for (int64_t k = threadIdx.x; k < r; k += blockDim.x) {
    const double v = load_double(row[k]);
    const ArgBest cand{v, k, bool(isnan(v))};
    if (beats(cand, mine)) mine = cand;
  }
  best[threadIdx.x] = mine;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w && beats(best[threadIdx.x + w], best[threadIdx.x])) best[threadIdx.x] = best[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = best[0].k == INT64_MAX ? 0 : best[0].k;
}

}  // namespace

void reduce(ReduceOp op, const Array& x, Array& out, int64_t outer, int64_t r, int64_t inner) {
  if (outer * inner == 0) return;
  if (r == 0) {  // empty reduction: the identity (sum 0; max/min of nothing as the CPU: ±inf)
    dispatch_device(x.dtype(), "reduce", [&](auto tag) {
      using T = decltype(tag);
      reduce_columns_kernel<<<blocks_for(outer * inner), kThreads, 0, stream()>>>(op, ptr<T>(x), mptr<T>(out), outer,
                                                                                   int64_t(0), inner);
    });
    check_launch("reduce");
    return;
  }
  dispatch_device(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    const int64_t cols = outer * inner, col_blocks = (cols + kThreads - 1) / kThreads;
    // Enough blocks for every SM a few times over, each chunk at least 16 rows long.
    const int64_t splits = std::min<int64_t>(std::max<int64_t>(1, 1024 / col_blocks), std::max<int64_t>(1, r / 16));
    if (inner == 1 && r >= 64) {
      reduce_rows_kernel<<<unsigned(outer), kThreads, 0, stream()>>>(op, ptr<T>(x), mptr<T>(out), r);
    } else if (splits > 1) {
      const int64_t chunk = (r + splits - 1) / splits, used = (r + chunk - 1) / chunk;
      // 8-byte partials (double or int64); there is no f64 dtype, i64 has the size.
      Array part = Array::empty({used, cols}, DType::i64, x.device());
      auto* pp = static_cast<acc_t<T>*>(part.raw());
      reduce_columns_partial_kernel<<<dim3(unsigned(col_blocks), unsigned(used)), kThreads, 0, stream()>>>(
          op, ptr<T>(x), pp, outer, r, inner, chunk);
      reduce_partials_kernel<<<blocks_for(cols), kThreads, 0, stream()>>>(op, pp, mptr<T>(out), cols, used);
    } else
      reduce_columns_kernel<<<blocks_for(outer * inner), kThreads, 0, stream()>>>(op, ptr<T>(x), mptr<T>(out), outer, r,
                                                                                   inner);
  });
  check_launch("reduce");
}

void argmax(const Array& x, Array& out, int64_t outer, int64_t r, int64_t inner) {
  if (outer * inner == 0) return;
  dispatch_device(x.dtype(), "argmax", [&](auto tag) {
    using T = decltype(tag);
    if (inner == 1 && r >= 256)
      argmax_rows_kernel<<<unsigned(outer), kThreads, 0, stream()>>>(ptr<T>(x), mptr<int64_t>(out), r);
    else
      argmax_kernel<<<blocks_for(outer * inner), kThreads, 0, stream()>>>(ptr<T>(x), mptr<int64_t>(out), outer, r, inner);
  });
  check_launch("argmax");
}

}  // namespace mt::cuda
