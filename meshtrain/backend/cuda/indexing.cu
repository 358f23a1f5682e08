// Gather / scatter-add / top-k / one-hot kernels. Index arrays are validated first
// (index_verdict: a device scan writing the first bad position, which the caller reads at once
// or with the step's loss), so kernels never see an out-of-range index.
// scatter_add (the embedding's gradient) is deterministic: the update positions are sorted by
// destination row (a stable radix sort keeps index order), and each output element is summed
// by one thread in index order in f32, as the CPU sums it, so the two agree bit for bit and two
// runs (eager or a replayed graph) round alike. With atomics the order of additions changed
// from run to run: a captured run's losses drifted from the eager run's by 2e-7 (H200).
// scatter_add_along_axis still accumulates with atomics (the cross-entropy's gather hits each
// destination once, where the order cannot matter).
#include <vector>

#include <cub/device/device_radix_sort.cuh>

#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/indexing.h"

namespace mt::cuda {

namespace {

template <class F>
void dispatch_index(const Array& idx, const char* op, F&& f) {
  if (idx.dtype() == DType::i32) f(int32_t{});
  else if (idx.dtype() == DType::i64) f(int64_t{});
  else throw Error(detail::concat("[", op, "] indices must be i32 or i64, got ", idx.str()));
}

// `first` starts at kNoBadIndex; positions are non-negative, so the unsigned minimum is theirs.
template <class I>
__global__ void index_verdict_kernel(const I* idx, int64_t n, int64_t size, int64_t skip, unsigned long long* first,
                                     I* safe) {
  MT_GRID_LOOP(j, n) {
    const int64_t v = int64_t(idx[j]);
    const bool ok = (v >= 0 && v < size) || v == skip;
    if (!ok) atomicMin(first, (unsigned long long)j);
    if (safe) safe[j] = ok ? idx[j] : I(0);
  }
}

template <class W, class I>
__global__ void take_kernel(const W* x, const I* idx, W* out, int64_t outer, int64_t a, int64_t n, int64_t inner) {
  MT_GRID_LOOP(e, outer * n * inner) {
    const int64_t r = e % inner, j = (e / inner) % n, o = e / (inner * n);
    out[e] = x[(o * a + int64_t(idx[j])) * inner + r];
  }
}

// The sort's input: each position's destination row as the key, the position as the value.
template <class I>
__global__ void sort_input_kernel(const I* idx, uint32_t* keys, int32_t* positions, int64_t n) {
  MT_GRID_LOOP(j, n) {
    keys[j] = uint32_t(idx[j]);
    positions[j] = int32_t(j);
  }
}

// One thread per (outer, sorted position, column); the thread at the first position of a
// destination's run sums the run's updates in index order and owns the output element. A run
// is walked 8 positions at a time, their keys, positions and updates each loaded together
// before the in-order adds: a run thousands long (BERT's padding id) then waits on three
// memory round trips per 8 updates, not two per update.
template <class A, class T>
__global__ void scatter_add_sorted_kernel(const T* upd, const uint32_t* keys, const int32_t* order, A* acc,
                                          int64_t outer, int64_t a, int64_t n, int64_t inner) {
  constexpr int kBatch = 8;
  MT_GRID_LOOP(e, outer * n * inner) {
    const int64_t r = e % inner, p = (e / inner) % n, o = e / (inner * n);
    const uint32_t key = keys[p];
    if (p > 0 && keys[p - 1] == key) continue;
    A sum = 0;
    for (int64_t q = p; q < n; q += kBatch) {
      uint32_t k[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) k[u] = q + u < n ? keys[q + u] : ~key;
      int run = 0;  // how many of the batch's positions, from its first, are the run's
#pragma unroll
      for (int u = 0; u < kBatch; ++u) run += (run == u && k[u] == key) ? 1 : 0;
      T v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (u < run) v[u] = upd[(o * n + order[q + u]) * inner + r];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (u >= run) break;
        if constexpr (std::is_same_v<A, float>) sum += to_f32(v[u]);
        else sum += int64_t(v[u]);
      }
      if (run < kBatch) break;
    }
    acc[(o * a + int64_t(key)) * inner + r] = sum;
  }
}

// (keys, positions) sorted by key, stably: each destination's positions in index order.
struct SortedPositions {
  Array keys, order;
};

template <class I>
SortedPositions sort_by_destination(const Array& idx, int64_t a) {
  const int64_t n = idx.numel();
  MT_CHECK(n < (int64_t(1) << 31) && a <= (int64_t(1) << 32),
           "[scatter_add] at most 2^31 indices into at most 2^32 rows, got ", n, " into ", a);
  const Device dev = idx.device();
  Array keys_in = Array::empty(Shape{n}, DType::i32, dev), keys = Array::empty(Shape{n}, DType::i32, dev);
  Array pos_in = Array::empty(Shape{n}, DType::i32, dev), order = Array::empty(Shape{n}, DType::i32, dev);
  auto* kin = static_cast<uint32_t*>(keys_in.raw());
  auto* kout = static_cast<uint32_t*>(keys.raw());
  auto* pin = static_cast<int32_t*>(pos_in.raw());
  auto* pout = static_cast<int32_t*>(order.raw());
  sort_input_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<I>(idx), kin, pin, n);
  // Only the key bits a row number can use: fewer radix passes.
  int bits = 1;
  while (bits < 32 && (int64_t(1) << bits) < a) ++bits;
  size_t temp_bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, kin, kout, pin, pout, int(n), 0, bits, stream()),
        "scatter_add sort");
  Array temp = Array::empty(Shape{int64_t(temp_bytes / 8 + 1)}, DType::i64, dev);
  check(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, kin, kout, pin, pout, int(n), 0, bits, stream()),
        "scatter_add sort");
  return {keys, order};
}

template <class A, class T>
__global__ void from_acc_kernel(const A* acc, T* out, int64_t n) {
  MT_GRID_LOOP(i, n) {
    if constexpr (is_float_v<T>) out[i] = from_f32<T>(float(acc[i]));
    else out[i] = T(acc[i]);
  }
}

// Offsets in x (strides s.strides[0]) of each element of the index array (dims s.dims),
// with the coordinate along `axis` replaced by the index value.
template <class I>
__device__ inline int64_t along_axis_offset(const Strided& s, int axis, const I* idx, int64_t e) {
  int64_t rem = e, off = 0;
  for (int d = s.ndim - 1; d >= 0; --d) {
    const int64_t c = rem % s.dims[d];
    rem /= s.dims[d];
    off += (d == axis ? int64_t(idx[e]) : c) * s.strides[0][d];
  }
  return off;
}

template <class W, class I>
__global__ void take_along_axis_kernel(const W* x, const I* idx, W* out, int64_t n, Strided s, int axis) {
  MT_GRID_LOOP(e, n) out[e] = x[along_axis_offset(s, axis, idx, e)];
}

template <class A, class T, class I>
__global__ void scatter_add_along_axis_kernel(const T* upd, const I* idx, A* acc, int64_t n, Strided s, int axis) {
  MT_GRID_LOOP(e, n) {
    const int64_t dst = along_axis_offset(s, axis, idx, e);
    if constexpr (std::is_same_v<A, float>) atomicAdd(acc + dst, to_f32(upd[e]));
    else atomicAdd(reinterpret_cast<unsigned long long*>(acc + dst), (unsigned long long)(int64_t(upd[e])));
  }
}

template <class T, class I>
__global__ void one_hot_kernel(const I* ids, T* out, int64_t n, int64_t classes) {
  MT_GRID_LOOP(e, n * classes) {
    const int64_t j = e / classes, c = e % classes;
    out[e] = store<T>(compute_t<T>(int64_t(ids[j]) == c ? 1 : 0));
  }
}

// top-k, one block per line: k rounds, each taking the best element ranked after the
// previous pick in the order NaN first, then larger value, then lower index (the CPU's order).
struct Pick {
  float v;  // values of integer arrays are compared exactly through `iv`
  int64_t iv;
  int64_t i;  // INT64_MAX: none
  bool nan;
};
__device__ inline bool ranks_before(const Pick& p, const Pick& q, bool integer) {  // p before q?
  if (p.i == INT64_MAX) return false;
  if (q.i == INT64_MAX) return true;
  if (p.nan != q.nan) return p.nan;
  if (!p.nan) {
    if (integer ? p.iv != q.iv : p.v != q.v) return integer ? p.iv > q.iv : p.v > q.v;
  }
  return p.i < q.i;
}
template <class T>
__global__ void top_k_kernel(const T* x, T* values, int64_t* indices, int64_t a, int64_t inner, int64_t k) {
  __shared__ Pick best[kThreads];
  constexpr bool integer = !is_float_v<T>;
  const int64_t line = blockIdx.x, o = line / inner, r = line % inner;
  const T* src = x + o * a * inner + r;
  Pick prev{0.f, 0, INT64_MAX, false};
  bool have_prev = false;
  for (int64_t j = 0; j < k; ++j) {
    Pick mine{0.f, 0, INT64_MAX, false};
    for (int64_t i = threadIdx.x; i < a; i += blockDim.x) {
      Pick c;
      c.i = i;
      if constexpr (integer) {
        c.iv = int64_t(src[i * inner]);
        c.v = 0.f;
        c.nan = false;
      } else {
        c.v = to_f32(src[i * inner]);
        c.iv = 0;
        c.nan = isnan(c.v);
      }
      if (have_prev && !ranks_before(prev, c, integer)) continue;  // already taken
      if (ranks_before(c, mine, integer)) mine = c;
    }
    best[threadIdx.x] = mine;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (int(threadIdx.x) < w && ranks_before(best[threadIdx.x + w], best[threadIdx.x], integer))
        best[threadIdx.x] = best[threadIdx.x + w];
      __syncthreads();
    }
    prev = best[0];
    have_prev = true;
    if (threadIdx.x == 0) {
      const int64_t dst = (o * k + j) * inner + r;
      values[dst] = src[prev.i * inner];
      indices[dst] = prev.i;
    }
    __syncthreads();
  }
}

// Zeroed f32 (floating) or i64 accumulation buffer; `out` itself when it already has that type.
Array accumulator_for(Array& out, bool floating) {
  const DType acc = floating ? DType::f32 : DType::i64;
  Array buf = out.dtype() == acc ? out : Array::empty(out.shape(), acc, out.device());
  check(cudaMemsetAsync(buf.raw(), 0, buf.nbytes(), stream()), "scatter_add");
  return buf;
}
template <class T>
void finish_accumulator(const Array& buf, Array& out) {
  if (buf.shares_storage(out)) return;
  const int64_t n = out.numel();
  if constexpr (is_float_v<T>)
    from_acc_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<float>(buf), mptr<T>(out), n);
  else
    from_acc_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<int64_t>(buf), mptr<T>(out), n);
}

template <class F>
void dispatch_width(size_t es, F&& f) {
  switch (es) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
  }
  throw Error(detail::concat("[take] unsupported element size ", es));
}

Strided index_layout(const Shape& idx_shape, const std::vector<int64_t>& target_strides, const char* op) {
  MT_CHECK(idx_shape.ndim() <= kMaxDims, "[", op, "] more than ", kMaxDims, " dims on the GPU");
  Strided s;
  s.ndim = idx_shape.ndim();
  for (int d = 0; d < s.ndim; ++d) {
    s.dims[d] = idx_shape[d];
    s.strides[0][d] = target_strides[size_t(d)];
  }
  return s;
}

}  // namespace

void index_verdict(const Array& idx, int64_t size, int64_t skip, Array& first, Array* safe, const char* op) {
  MT_CHECK(idx.dtype() == DType::i32 || idx.dtype() == DType::i64, "[", op, "] indices must be i32 or i64, got ",
           idx.str());
  const int64_t none = kNoBadIndex;
  fill_pattern(first.raw(), &none, 8, 1);
  const int64_t n = idx.numel();
  if (n == 0) return;
  dispatch_index(idx, op, [&](auto tag) {
    using I = decltype(tag);
    index_verdict_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(
        ptr<I>(idx), n, size, skip, static_cast<unsigned long long*>(first.raw()), safe ? mptr<I>(*safe) : nullptr);
  });
  check_launch(op);
}

void take(const Array& x, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner) {
  const int64_t n = idx.numel();
  if (outer * n * inner == 0) return;
  dispatch_width(dtype_size(x.dtype()), [&](auto w) {
    using W = decltype(w);
    dispatch_index(idx, "take", [&](auto tag) {
      using I = decltype(tag);
      take_kernel<<<blocks_for(outer * n * inner), kThreads, 0, stream()>>>(ptr<W>(x), ptr<I>(idx), mptr<W>(out), outer,
                                                                            a, n, inner);
    });
  });
  check_launch("take");
}

void scatter_add(const Array& upd, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner) {
  const int64_t n = idx.numel();
  dispatch_device(upd.dtype(), "scatter_add", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error("[scatter_add] bool updates are not supported");
    } else {
      Array acc = accumulator_for(out, is_float_v<T>);
      if (outer * n * inner > 0) {
        dispatch_index(idx, "scatter_add", [&](auto itag) {
          using I = decltype(itag);
          const SortedPositions s = sort_by_destination<I>(idx, a);
          const auto* keys = static_cast<const uint32_t*>(s.keys.raw());
          const auto* order = static_cast<const int32_t*>(s.order.raw());
          if constexpr (is_float_v<T>)
            scatter_add_sorted_kernel<<<blocks_for(outer * n * inner), kThreads, 0, stream()>>>(
                ptr<T>(upd), keys, order, mptr<float>(acc), outer, a, n, inner);
          else
            scatter_add_sorted_kernel<<<blocks_for(outer * n * inner), kThreads, 0, stream()>>>(
                ptr<T>(upd), keys, order, mptr<int64_t>(acc), outer, a, n, inner);
        });
      }
      finish_accumulator<T>(acc, out);
    }
  });
  check_launch("scatter_add");
}

void take_along_axis(const Array& x, const Array& idx, Array& out, int axis) {
  const int64_t n = idx.numel();
  if (n == 0) return;
  const Strided s = index_layout(idx.shape(), x.shape().strides(), "take_along_axis");
  dispatch_width(dtype_size(x.dtype()), [&](auto w) {
    using W = decltype(w);
    dispatch_index(idx, "take_along_axis", [&](auto tag) {
      using I = decltype(tag);
      take_along_axis_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<W>(x), ptr<I>(idx), mptr<W>(out), n, s, axis);
    });
  });
  check_launch("take_along_axis");
}

void scatter_add_along_axis(const Array& upd, const Array& idx, Array& out, int axis) {
  const int64_t n = idx.numel();
  const Strided s = index_layout(idx.shape(), out.shape().strides(), "scatter_add_along_axis");
  dispatch_device(upd.dtype(), "scatter_add_along_axis", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error("[scatter_add_along_axis] bool updates are not supported");
    } else {
      Array acc = accumulator_for(out, is_float_v<T>);
      if (n > 0) {
        dispatch_index(idx, "scatter_add_along_axis", [&](auto itag) {
          using I = decltype(itag);
          if constexpr (is_float_v<T>)
            scatter_add_along_axis_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<T>(upd), ptr<I>(idx),
                                                                                    mptr<float>(acc), n, s, axis);
          else
            scatter_add_along_axis_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<T>(upd), ptr<I>(idx),
                                                                                    mptr<int64_t>(acc), n, s, axis);
        });
      }
      finish_accumulator<T>(acc, out);
    }
  });
  check_launch("scatter_add_along_axis");
}

void top_k(const Array& x, Array& values, Array& indices, int64_t outer, int64_t a, int64_t inner, int64_t k) {
  if (outer * inner * k == 0) return;
  dispatch_device(x.dtype(), "top_k", [&](auto tag) {
    using T = decltype(tag);
    top_k_kernel<<<unsigned(outer * inner), kThreads, 0, stream()>>>(ptr<T>(x), mptr<T>(values),
                                                                     mptr<int64_t>(indices), a, inner, k);
  });
  check_launch("top_k");
}

void one_hot(const Array& ids, Array& out, int64_t num_classes) {
  const int64_t n = ids.numel();
  if (n * num_classes == 0) return;
  dispatch_device(out.dtype(), "one_hot", [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(ids, "one_hot", [&](auto itag) {
      using I = decltype(itag);
      one_hot_kernel<<<blocks_for(n * num_classes), kThreads, 0, stream()>>>(ptr<I>(ids), mptr<T>(out), n, num_classes);
    });
  });
  check_launch("one_hot");
}

}  // namespace mt::cuda
