#include "meshtrain/backend/indexing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "meshtrain/core/element.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

namespace {

template <class F>
decltype(auto) dispatch_index(const Array& idx, F&& f) {
  if (idx.dtype() == DType::i32) return f(idx.data<int32_t>());
  return f(idx.data<int64_t>());
}

template <class T>
constexpr bool is_float_like = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// Scatter sums accumulate floats in f32 (one rounding for bf16/f16) and integers in i64.
template <class T>
using Acc = std::conditional_t<is_float_like<T>, float, int64_t>;

template <class T>
inline Acc<T> to_acc(T v) {
  if constexpr (is_float_like<T>) return load_f32(v);
  else return Acc<T>(v);
}
template <class T>
inline T from_acc(Acc<T> v) {
  if constexpr (is_float_like<T>) return store_f32<T>(v);
  else return T(v);
}

// Offsets (in elements of an array with `strides`) of every coordinate of dims[lo, hi),
// in row-major order: the per-line bases of take_along_axis / scatter_add_along_axis.
std::vector<int64_t> coordinate_offsets(const Shape& dims, const std::vector<int64_t>& strides, int lo, int hi) {
  std::vector<int64_t> offs{0};
  for (int d = lo; d < hi; ++d) {
    std::vector<int64_t> next;
    next.reserve(offs.size() * size_t(dims[d]));
    for (int64_t base : offs)
      for (int64_t c = 0; c < dims[d]; ++c) next.push_back(base + c * strides[size_t(d)]);
    offs = std::move(next);
  }
  return offs;
}

// Copies `n` elements of `es` bytes; typed for the common sizes so inner == 1 stays cheap.
inline void copy_elems(char* dst, const char* src, int64_t n, size_t es) {
  if (n == 1) {
    switch (es) {
      case 1: *dst = *src; return;
      case 2: std::memcpy(dst, src, 2); return;
      case 4: std::memcpy(dst, src, 4); return;
      case 8: std::memcpy(dst, src, 8); return;
      default: break;
    }
  }
  std::memcpy(dst, src, size_t(n) * es);
}

}  // namespace

void index_verdict(const Array& idx, int64_t size, int64_t skip, Array& first, Array* safe, const char* op) {
  MT_CHECK(idx.dtype() == DType::i32 || idx.dtype() == DType::i64, "[", op, "] indices must be i32 or i64, got ",
           idx.str());
  int64_t bad = kNoBadIndex;
  dispatch_index(idx, [&](const auto* pi) {
    using I = std::remove_const_t<std::remove_pointer_t<decltype(pi)>>;
    I* ps = safe ? safe->data<I>() : nullptr;
    const int64_t n = idx.numel();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t v = int64_t(pi[j]);
      const bool ok = (v >= 0 && v < size) || v == skip;
      if (!ok && bad == kNoBadIndex) bad = j;
      if (ps) ps[j] = ok ? pi[j] : I(0);
    }
  });
  first.data<int64_t>()[0] = bad;
}

void take(const Array& x, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner) {
  const size_t es = dtype_size(x.dtype());
  const int64_t n = idx.numel();
  const char* px = static_cast<const char*>(x.raw());
  char* po = static_cast<char*>(out.raw());
  dispatch_index(idx, [&](const auto* pi) {
#pragma omp parallel for collapse(2) if (outer * n * inner > grain::copy) schedule(static)
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < n; ++j)
        copy_elems(po + size_t((o * n + j) * inner) * es, px + size_t((o * a + int64_t(pi[j])) * inner) * es, inner,
                   es);
  });
}

void scatter_add(const Array& upd, const Array& idx, Array& out, int64_t outer, int64_t a, int64_t inner) {
  const int64_t n = idx.numel();
  // Counting sort of update positions by destination row (stable: index order kept).
  std::vector<int64_t> start(size_t(a) + 1, 0), order(static_cast<size_t>(n));
  dispatch_index(idx, [&](const auto* pi) {
    for (int64_t j = 0; j < n; ++j) ++start[size_t(pi[j]) + 1];
    std::partial_sum(start.begin(), start.end(), start.begin());
    std::vector<int64_t> cursor(start.begin(), start.end() - 1);
    for (int64_t j = 0; j < n; ++j) order[size_t(cursor[size_t(pi[j])]++)] = j;
  });
  dispatch_dtype(upd.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error("[scatter_add] bool updates are not supported");
    } else {
      const T* pu = upd.data<T>();
      T* po = out.data<T>();
      // Each task owns one (row, column chunk) of the output: no two tasks write the same element.
      constexpr int64_t kChunk = 2048;
      const int64_t chunks = std::max<int64_t>(1, (inner + kChunk - 1) / kChunk);
      const int64_t tasks = inner == 0 ? 0 : outer * a * chunks;
#pragma omp parallel if (outer * a * inner + n * inner > grain::copy)
      {
        std::vector<Acc<T>> acc(size_t(std::min(inner, kChunk)));
#pragma omp for schedule(dynamic, 16)
        for (int64_t t = 0; t < tasks; ++t) {
          const int64_t row = t / chunks, c0 = (t % chunks) * kChunk;
          const int64_t o = row / a, r = row % a, len = std::min(kChunk, inner - c0);
          std::fill(acc.begin(), acc.begin() + len, Acc<T>(0));
          for (int64_t p = start[size_t(r)]; p < start[size_t(r) + 1]; ++p) {
            const T* src = pu + (o * n + order[size_t(p)]) * inner + c0;
            for (int64_t i = 0; i < len; ++i) acc[size_t(i)] += to_acc(src[i]);
          }
          T* dst = po + row * inner + c0;
          for (int64_t i = 0; i < len; ++i) dst[i] = from_acc<T>(acc[size_t(i)]);
        }
      }
    }
  });
}

void take_along_axis(const Array& x, const Array& idx, Array& out, int axis) {
  const Shape& is = idx.shape();
  const std::vector<int64_t> xs = x.shape().strides();
  const std::vector<int64_t> lead = coordinate_offsets(is, xs, 0, axis);
  const std::vector<int64_t> trail = coordinate_offsets(is, xs, axis + 1, is.ndim());
  const int64_t outer = int64_t(lead.size()), n = is[axis], inner = int64_t(trail.size());
  const int64_t step = xs[size_t(axis)];
  const size_t es = dtype_size(x.dtype());
  const char* px = static_cast<const char*>(x.raw());
  char* po = static_cast<char*>(out.raw());
  dispatch_index(idx, [&](const auto* pi) {
#pragma omp parallel for collapse(2) if (outer * n * inner > grain::copy) schedule(static)
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p0 = (o * n + j) * inner;
        for (int64_t r = 0; r < inner; ++r)
          copy_elems(po + size_t(p0 + r) * es,
                     px + size_t(lead[size_t(o)] + trail[size_t(r)] + int64_t(pi[p0 + r]) * step) * es, 1, es);
      }
  });
}

void scatter_add_along_axis(const Array& upd, const Array& idx, Array& out, int axis) {
  const Shape& is = idx.shape();
  const std::vector<int64_t> xs = out.shape().strides();
  const std::vector<int64_t> lead = coordinate_offsets(is, xs, 0, axis);
  const std::vector<int64_t> trail = coordinate_offsets(is, xs, axis + 1, is.ndim());
  const int64_t outer = int64_t(lead.size()), n = is[axis], inner = int64_t(trail.size());
  const int64_t step = xs[size_t(axis)];
  dispatch_dtype(upd.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error("[scatter_add_along_axis] bool updates are not supported");
    } else {
      using A = Acc<T>;
      const T* pu = upd.data<T>();
      std::vector<A> buffer;
      A* acc;
      if constexpr (std::is_same_v<T, A>) {
        acc = out.data<T>();
        std::fill(acc, acc + out.numel(), A(0));
      } else {
        buffer.assign(size_t(out.numel()), A(0));
        acc = buffer.data();
      }
      // Index lines (o, r) map to distinct output lines, so tasks over (o, r-chunk) never collide.
      constexpr int64_t kChunk = 256;
      const int64_t chunks = std::max<int64_t>(1, (inner + kChunk - 1) / kChunk);
      const int64_t tasks = inner == 0 ? 0 : outer * chunks;
      dispatch_index(idx, [&](const auto* pi) {
#pragma omp parallel for if (outer * n * inner > grain::copy) schedule(static)
        for (int64_t t = 0; t < tasks; ++t) {
          const int64_t o = t / chunks, r0 = (t % chunks) * kChunk, r1 = std::min(inner, r0 + kChunk);
          for (int64_t j = 0; j < n; ++j) {
            const int64_t p0 = (o * n + j) * inner;
            for (int64_t r = r0; r < r1; ++r)
              acc[lead[size_t(o)] + trail[size_t(r)] + int64_t(pi[p0 + r]) * step] += to_acc(pu[p0 + r]);
          }
        }
      });
      if constexpr (!std::is_same_v<T, A>) {
        T* po = out.data<T>();
        const int64_t total = out.numel();
#pragma omp parallel for if (total > grain::copy) schedule(static)
        for (int64_t i = 0; i < total; ++i) po[i] = from_acc<T>(acc[i]);
      }
    }
  });
}

void top_k(const Array& x, Array& values, Array& indices, int64_t outer, int64_t a, int64_t inner, int64_t k) {
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Key = std::conditional_t<is_float_like<T>, float, T>;
    const T* px = x.data<T>();
    T* pv = values.data<T>();
    int64_t* pi = indices.data<int64_t>();
    const int64_t lines = outer * inner;
#pragma omp parallel if (lines * a > grain::compute && lines > 1)
    {
      std::vector<Key> line(static_cast<size_t>(a));
      std::vector<int64_t> order(static_cast<size_t>(a));
#pragma omp for schedule(static)
      for (int64_t l = 0; l < lines; ++l) {
        const int64_t o = l / inner, r = l % inner;
        const T* src = px + o * a * inner + r;
        for (int64_t i = 0; i < a; ++i) {
          if constexpr (is_float_like<T>) line[size_t(i)] = load_f32(src[i * inner]);
          else line[size_t(i)] = src[i * inner];
        }
        std::iota(order.begin(), order.end(), int64_t(0));
        // Strict weak order: NaN first, then larger values, then lower index.
        auto before = [&](int64_t i, int64_t j) {
          Key vi = line[size_t(i)], vj = line[size_t(j)];
          if constexpr (is_float_like<T>) {
            bool ni = std::isnan(vi), nj = std::isnan(vj);
            if (ni != nj) return ni;
            if (ni) return i < j;
          }
          if (vi != vj) return vi > vj;
          return i < j;
        };
        std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t dst = (o * k + j) * inner + r;
          pv[dst] = src[order[size_t(j)] * inner];
          pi[dst] = order[size_t(j)];
        }
      }
    }
  });
}

void one_hot(const Array& ids, Array& out, int64_t num_classes) {
  std::memset(out.raw(), 0, out.nbytes());
  const int64_t n = ids.numel();
  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* po = out.data<T>();
    const T one = from_double<T>(1.0);
    dispatch_index(ids, [&](const auto* pi) {
#pragma omp parallel for if (n > grain::copy) schedule(static)
      for (int64_t j = 0; j < n; ++j) po[j * num_classes + int64_t(pi[j])] = one;
    });
  });
}

}  // namespace mt::cpu
