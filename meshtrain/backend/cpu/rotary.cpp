// Built with -ffp-contract=off (CMakeLists.txt): each product is rounded before the sum, as
// the composed mul and sub/add round them.
#include "meshtrain/backend/rotary.h"

#include "meshtrain/core/element.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

void rotary(const Array& x, const Array& cos, const Array& sin, const kernels::RotaryShape& s, Array& out) {
  const int64_t half = s.d / 2, rows = s.outer * s.t * s.inner;
  dispatch_float(x.dtype(), "rotary", [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.data<T>(), *pc = cos.data<T>(), *ps = sin.data<T>();
    T* po = out.data<T>();
    // A product as the composed mul leaves it: rounded to T.
    auto rounded = [](float v) { return load_f32(store_f32<T>(v)); };
    // The backward adds +0 (-0 becomes +0, nothing else changes), as the composed one does.
    const float zero_sum = s.inverse ? 0.0f : -0.0f;
#pragma omp parallel for if (rows * s.d > grain::compute)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = r / (s.t * s.inner), t = (r / s.inner) % s.t;
      const int64_t table = ((s.per_batch ? (o / s.outer_per_batch) * s.t : 0) + t) * half;
      const T* xr = px + r * s.d;
      T* yr = po + r * s.d;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t ia = s.interleaved ? 2 * i : i, ib = s.interleaved ? 2 * i + 1 : i + half;
        const float a = load_f32(xr[ia]), b = load_f32(xr[ib]), c = load_f32(pc[table + i]);
        const float sn = s.inverse ? -load_f32(ps[table + i]) : load_f32(ps[table + i]);
        yr[ia] = store_f32<T>((rounded(a * c) - rounded(b * sn)) + zero_sum);
        yr[ib] = store_f32<T>((rounded(b * c) + rounded(a * sn)) + zero_sum);
      }
    }
  });
}

}  // namespace mt::cpu
