#include "meshtrain/backend/reduce.h"

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "meshtrain/core/element.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

using kernels::ReduceOp;

void reduce(ReduceOp op, const Array& x, Array& out, int64_t outer, int64_t r, int64_t inner) {
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Acc = std::conditional_t<std::is_same_v<T, int64_t> || std::is_same_v<T, int32_t> || std::is_same_v<T, bool>,
                                   int64_t, double>;
    const T* px = x.data<T>();
    T* po = out.data<T>();
    auto init = [&]() -> Acc {
      if (op == ReduceOp::sum) return Acc(0);
      if constexpr (std::is_same_v<Acc, double>)
        return op == ReduceOp::max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
      else return op == ReduceOp::max ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
    };
    auto combine = [&](Acc a, Acc v) -> Acc {
      if (op == ReduceOp::sum) return a + v;
      if constexpr (std::is_same_v<Acc, double>) {
        if (std::isnan(v) || std::isnan(a)) return std::numeric_limits<double>::quiet_NaN();
      }
      return op == ReduceOp::max ? (v > a ? v : a) : (v < a ? v : a);
    };
    const bool by_outer = outer >= inner;
#pragma omp parallel for if (outer * r * inner > grain::compute && by_outer && outer > 1) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const T* base = px + o * r * inner;
      if (inner == 1) {
        Acc acc = init();
        for (int64_t k = 0; k < r; ++k) acc = combine(acc, Acc(to_double(base[k])));
        po[o] = from_double<T>(double(acc));
        continue;
      }
      std::vector<Acc> acc(size_t(inner), init());
      for (int64_t k = 0; k < r; ++k) {
        const T* row = base + k * inner;
        for (int64_t i = 0; i < inner; ++i) acc[size_t(i)] = combine(acc[size_t(i)], Acc(to_double(row[i])));
      }
      for (int64_t i = 0; i < inner; ++i) po[o * inner + i] = from_double<T>(double(acc[size_t(i)]));
    }
  });
}

void argmax(const Array& x, Array& out, int64_t outer, int64_t r, int64_t inner) {
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    int64_t* po = out.data<int64_t>();
#pragma omp parallel for if (outer * r * inner > grain::compute && outer > 1) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        int64_t best = 0;
        double best_v = -std::numeric_limits<double>::infinity();
        for (int64_t k = 0; k < r; ++k) {
          double v = to_double(px[(o * r + k) * inner + i]);
          if (std::isnan(v)) {  // NaN wins, as in torch.argmax
            best = k;
            break;
          }
          if (k == 0 || v > best_v) {
            best_v = v;
            best = k;
          }
        }
        po[o * inner + i] = best;
      }
    }
  });
}

}  // namespace mt::cpu
