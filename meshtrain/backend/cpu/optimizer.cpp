#include "meshtrain/backend/optimizer.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/backend/elementwise.h"
#include "meshtrain/core/element.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

using kernels::AdamHyper;

// Built with -ffp-contract=off: each product is rounded before its sum, as the composed ops
// (and torch) round them, so the fused step equals the composed one bit for bit. The
// hyperparameters come by value: a reference could alias the outputs and keep loops scalar.
namespace {
void moments(const float* gp, const float* mp, const float* vp, int64_t n, const AdamHyper k, float* mo, float* vo) {
#pragma omp parallel for if (n > grain::compute) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = gp[i];
    mo[i] = mp[i] * k.b1 + gi * k.one_minus_b1;
    vo[i] = vp[i] * k.b2 + (gi * gi) * k.one_minus_b2;
  }
}

// The step's values, read from their buffer (in place: a CPU array waits for nothing).
struct StepValues {
  float step_size, sqrt_bc2, decay;
};
StepValues step_values(const Array& scalars) {
  const float* s = scalars.data<float>();
  return {s[kernels::kAdamStepSize], s[kernels::kAdamSqrtBc2], s[kernels::kAdamDecay]};
}

void direction(const float* mp, const float* vp, const float* pp, int64_t n, const float eps, const StepValues t,
               float* uo) {
  const float neg_step = -t.step_size, sqrt_bc2 = t.sqrt_bc2, decay = t.decay;
  if (pp) {
#pragma omp parallel for if (n > grain::compute) schedule(static)
    for (int64_t i = 0; i < n; ++i) uo[i] = (mp[i] / (std::sqrt(vp[i]) / sqrt_bc2 + eps)) * neg_step - pp[i] * decay;
  } else {
#pragma omp parallel for if (n > grain::compute) schedule(static)
    for (int64_t i = 0; i < n; ++i) uo[i] = (mp[i] / (std::sqrt(vp[i]) / sqrt_bc2 + eps)) * neg_step;
  }
}

}  // namespace

void adam_moments(const Array& g, const Array& m, const Array& v, const AdamHyper& h, Array& out) {
  const int64_t n = g.numel();
  moments(g.data<float>(), m.data<float>(), v.data<float>(), n, h, out.data<float>(), out.data<float>() + n);
}

void adam_direction(const Array& m, const Array& v, const Array* p, const AdamHyper& h, const Array& scalars,
                    Array& out) {
  direction(m.data<float>(), v.data<float>(), p ? p->data<float>() : nullptr, m.numel(), h.eps, step_values(scalars),
            out.data<float>());
}

void adam_moments_multi(const std::vector<Array>& in, const AdamHyper& h, Array& out) {
  const size_t k = in.size() / 3;
  const int64_t total = out.numel() / 2;
  float* mo = out.data<float>();
  int64_t offset = 0;
  for (size_t j = 0; j < k; ++j) {
    const int64_t n = in[j].numel();
    moments(in[j].data<float>(), in[k + j].data<float>(), in[2 * k + j].data<float>(), n, h, mo + offset,
            mo + total + offset);
    offset += n;
  }
}

void adam_direction_multi(const std::vector<Array>& in, const std::vector<uint8_t>& decays, const AdamHyper& h,
                          const Array& scalars, std::vector<Array>& outs) {
  const size_t k = in.size() / 3;
  const StepValues t = step_values(scalars);
  for (size_t j = 0; j < k; ++j)
    direction(in[j].data<float>(), in[k + j].data<float>(), decays[j] ? in[2 * k + j].data<float>() : nullptr,
              in[j].numel(), h.eps, t, outs[j].data<float>());
}

namespace {
// One tile of sum_squares_multi: up to kSumSquaresTile elements of tensor `tensor` from `start`.
struct SquaresTile {
  size_t tensor;
  int64_t start;
};
}  // namespace

void sum_squares_multi(const std::vector<Array>& in, Array& out) {
  std::vector<SquaresTile> tiles;
  for (size_t j = 0; j < in.size(); ++j)
    for (int64_t start = 0; start < in[j].numel(); start += kernels::kSumSquaresTile) tiles.push_back({j, start});
  std::vector<double> partial(tiles.size());
  const DType dtype = in.empty() ? DType::f32 : in[0].dtype();
  dispatch_float(dtype, "sum_squares_multi", [&](auto type) {
    using T = decltype(type);
    const int64_t count = int64_t(tiles.size());
#pragma omp parallel for if (count * kernels::kSumSquaresTile > grain::compute) schedule(static)
    for (int64_t t = 0; t < count; ++t) {
      const Array& x = in[tiles[size_t(t)].tensor];
      const T* p = x.data<T>() + tiles[size_t(t)].start;
      const int64_t n = std::min(kernels::kSumSquaresTile, x.numel() - tiles[size_t(t)].start);
      double s = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float v = load_f32(p[i]);
        s += double(v * v);
      }
      partial[size_t(t)] = s;
    }
  });
  double total = 0;
  for (double s : partial) total += s;
  *out.data<float>() = float(total);
}

void scale_multi(const std::vector<Array>& in, const Array& scale, std::vector<Array>& outs) {
  const float c = *scale.data<float>();
  for (size_t j = 0; j < in.size(); ++j)
    dispatch_float(in[j].dtype(), "scale_multi", [&](auto type) {
      using T = decltype(type);
      const T* x = in[j].data<T>();
      T* y = outs[j].data<T>();
      const int64_t n = in[j].numel();
#pragma omp parallel for if (n > grain::compute) schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] = store_f32<T>(load_f32(x[i]) * c);
    });
}

void cast_multi(const std::vector<Array>& in, std::vector<Array>& outs) {
  for (size_t j = 0; j < in.size(); ++j) cast(in[j], outs[j]);
}

void add_multi(const std::vector<Array>& in, std::vector<Array>& outs) {
  const size_t k = in.size() / 2;
  for (size_t j = 0; j < k; ++j)
    dispatch_float(in[j].dtype(), "add_multi", [&](auto type) {
      using T = decltype(type);
      const T* a = in[j].data<T>();
      const T* b = in[k + j].data<T>();
      T* y = outs[j].data<T>();
      const int64_t n = in[j].numel();
#pragma omp parallel for if (n > grain::compute) schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] = store_f32<T>(load_f32(a[i]) + load_f32(b[i]));
    });
}

}  // namespace mt::cpu
