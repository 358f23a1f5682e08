#include "meshtrain/backend/norm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "meshtrain/backend/cpu/fast_math.h"
#include "meshtrain/core/element.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

namespace {

// Rows per chunk of the backward's weight/bias partial sums. Fixed, so the summation
// order (and hence the result) does not depend on the number of threads.
constexpr int64_t kRowChunk = 64;

int64_t row_count(const Array& x) { return x.ndim() == 0 ? 1 : x.numel() / x.dim(-1); }

// Loads one row of any float dtype into f32 scratch.
template <class T>
void load_row(const T* __restrict src,  // (C,)
              float* __restrict dst,    // (C,)
              int64_t c) {
#pragma omp simd
  for (int64_t i = 0; i < c; ++i) dst[i] = load_f32(src[i]);
}

// Dispatches on x's dtype and the affine parameters' shared dtype (weight's, else bias's;
// f32 when there are none).
template <class F>
void dispatch_x_w(const Array& x, const Array& w, const Array& b, const char* op, F&& f) {
  const DType param = w.defined() ? w.dtype() : b.defined() ? b.dtype() : DType::f32;
  dispatch_float(x.dtype(), op, [&](auto xt) { dispatch_float(param, op, [&](auto wt) { f(xt, wt); }); });
}

// The branch's dropout for one row: its keep threshold, scale and the row's uniforms.
struct RowDropout {
  const kernels::DropoutBranch* branch;
  RngKey key;  // the branch's, its last fold read once
  float threshold = 0, scale = 0;
  explicit RowDropout(const kernels::DropoutBranch* b) : branch(b) {
    if (!b) return;
    key = b->key.resolved();
    threshold = kernels::keep_threshold(b->rate);
    scale = b->rate < 1.0 ? float(1.0 / (1.0 - b->rate)) : 0.0f;
  }
  void uniforms(int64_t row, int64_t c, float* out) const {
    fill_uniform(key, uint64_t(kernels::row_stream_start(branch->input.defined() ? branch->input.shape()
                                                                                           : branch->grad.shape(),
                                                                  branch->block, row)),
                 c, out);
  }
};

}  // namespace

void norm_forward(bool center, const Array& x, const Array& weight, const Array& bias, double eps, Array& y,
                  Array& mean, Array& rstd, const kernels::DropoutBranch* branch) {
  const char* op = center ? "layer_norm" : "rms_norm";
  dispatch_x_w(x, weight, bias, op, [&](auto xt, auto wt) {
    using T = decltype(xt);
    using W = decltype(wt);
    const int64_t c = x.dim(-1), n = row_count(x);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const W* pw = weight.defined() ? weight.data<W>() : nullptr;
    const W* pb = bias.defined() ? bias.data<W>() : nullptr;
    float* pmean = mean.data<float>();
    float* prstd = rstd.data<float>();
    const RowDropout drop(branch);
    const T* pbranch = branch ? branch->input.data<T>() : nullptr;
    T* psum = branch ? branch->sum.data<T>() : nullptr;
    // Affine parameters converted once, not per row; absent ones become 1 and 0 so the
    // row loops stay branch-free.
    std::vector<float> wf(static_cast<size_t>(c), 1.0f), bf(static_cast<size_t>(c), 0.0f);
    if (pw) load_row(pw, wf.data(), c);
    if (pb) load_row(pb, bf.data(), c);
#pragma omp parallel if (n * c > grain::row && n > 1)
    {
      std::vector<float> row(static_cast<size_t>(c)), u(branch ? size_t(c) : 0);
#pragma omp for schedule(static)
      for (int64_t r = 0; r < n; ++r) {
        float* xr = row.data();
        load_row(px + r * c, xr, c);
        if (branch) {
          // s = x + dropout(branch), rounded as the composed ops round it; s is what is normalized.
          drop.uniforms(r, c, u.data());
          const T* br = pbranch + r * c;
          T* sr = psum + r * c;
          float* ur = u.data();
          // The dropped term in its own loop (no product-sum contraction into an FMA), then the sum.
          // The branch is read whether kept or not: a read under the condition is control flow
          // the vectorizer will not convert for 16-bit elements.
#pragma omp simd
          for (int64_t i = 0; i < c; ++i) {
            const float kept = load_f32(br[i]) * drop.scale;
            ur[i] = round_to_f32<T>(ur[i] >= drop.threshold ? kept : 0.0f);
          }
#pragma omp simd
          for (int64_t i = 0; i < c; ++i) xr[i] = round_to_f32<T>(xr[i] + ur[i]);
          // xr holds T values exactly, so storing them rounds nothing: sr gets the sum's bits.
#pragma omp simd
          for (int64_t i = 0; i < c; ++i) sr[i] = store_f32<T>(xr[i]);
        }
        double s = 0;
        if (center) {
#pragma omp simd reduction(+ : s)
          for (int64_t i = 0; i < c; ++i) s += xr[i];
        }
        const float mu = center ? float(s / double(c)) : 0.0f;
        double ss = 0;
        // Two passes (sum of squared deviations) instead of E[x^2] - E[x]^2, which cancels.
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < c; ++i) {
          double d = double(xr[i]) - double(mu);
          ss += d * d;
        }
        const float rs = float(1.0 / std::sqrt(ss / double(c) + eps));
        pmean[r] = mu;
        prstd[r] = rs;
        T* yr = py + r * c;
        const float* w = wf.data();
        const float* b = bf.data();
#pragma omp simd
        for (int64_t i = 0; i < c; ++i) yr[i] = store_f32<T>((xr[i] - mu) * rs * w[i] + b[i]);
      }
    }
  });
}

void norm_backward(bool center, const Array& g, const Array& x, const Array& weight, const Array& mean,
                   const Array& rstd, Array& dx, Array* dweight, Array* dbias, const kernels::DropoutBranch* branch) {
  const char* op = center ? "layer_norm" : "rms_norm";
  dispatch_x_w(x, weight, Array(), op, [&](auto xt, auto wt) {
    using T = decltype(xt);
    using W = decltype(wt);
    const int64_t c = x.dim(-1), n = row_count(x);
    const T* px = x.data<T>();
    const T* pg = g.data<T>();
    T* pdx = dx.data<T>();
    const W* pw = weight.defined() ? weight.data<W>() : nullptr;
    const float* pmean = mean.data<float>();
    const float* prstd = rstd.data<float>();
    std::vector<float> wf(static_cast<size_t>(c), 1.0f);  // 1 without a weight: branch-free rows
    if (pw) load_row(pw, wf.data(), c);
    const RowDropout drop(branch);
    T* pgrad = branch ? branch->grad.data<T>() : nullptr;
    const int64_t chunks = (n + kRowChunk - 1) / kRowChunk;
    const bool want_w = dweight != nullptr, want_b = dbias != nullptr;
    // Per-chunk partial sums of g * xhat (weight) and g (bias), reduced in chunk order below.
    std::vector<double> part_w(want_w ? size_t(chunks * c) : 0), part_b(want_b ? size_t(chunks * c) : 0);
#pragma omp parallel if (n * c > grain::row && chunks > 1)
    {
      std::vector<float> xhat(static_cast<size_t>(c)), gr(xhat.size()), gy(xhat.size()), u(branch ? xhat.size() : 0);
#pragma omp for schedule(static)
      for (int64_t ch = 0; ch < chunks; ++ch) {
        double* acc_w = want_w ? part_w.data() + ch * c : nullptr;
        double* acc_b = want_b ? part_b.data() + ch * c : nullptr;
        const int64_t r1 = std::min(n, (ch + 1) * kRowChunk);
        for (int64_t r = ch * kRowChunk; r < r1; ++r) {
          const float mu = center ? pmean[r] : 0.0f, rs = prstd[r];
          load_row(px + r * c, xhat.data(), c);
          load_row(pg + r * c, gr.data(), c);
          double sum_gy = 0, sum_gy_xhat = 0;
#pragma omp simd reduction(+ : sum_gy, sum_gy_xhat)
          for (int64_t i = 0; i < c; ++i) {
            xhat[size_t(i)] = (xhat[size_t(i)] - mu) * rs;
            gy[size_t(i)] = gr[size_t(i)] * wf[size_t(i)];
            sum_gy += gy[size_t(i)];
            sum_gy_xhat += double(gy[size_t(i)]) * xhat[size_t(i)];
          }
          // dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat)); no mean(gy) term for RMS norm.
          const float a = center ? float(sum_gy / double(c)) : 0.0f;
          const float b = float(sum_gy_xhat / double(c));
          T* dxr = pdx + r * c;
#pragma omp simd
          for (int64_t i = 0; i < c; ++i) dxr[i] = store_f32<T>(rs * (gy[size_t(i)] - a - xhat[size_t(i)] * b));
          if (branch) {
            // The branch's gradient: dropout(dx) with the forward's mask, drawn again.
            drop.uniforms(r, c, u.data());
            const float* ur = u.data();
            T* br = pgrad + r * c;
#pragma omp simd
            for (int64_t i = 0; i < c; ++i) {
              const float kept = load_f32(dxr[i]) * drop.scale;
              br[i] = store_f32<T>(ur[i] >= drop.threshold ? kept : 0.0f);
            }
          }
          const float* g_row = gr.data();
          const float* xhat_row = xhat.data();
          if (acc_w) {
#pragma omp simd
            for (int64_t i = 0; i < c; ++i) acc_w[i] += double(g_row[i]) * xhat_row[i];
          }
          if (acc_b) {
#pragma omp simd
            for (int64_t i = 0; i < c; ++i) acc_b[i] += g_row[i];
          }
        }
      }
    }
    auto finish = [&](const std::vector<double>& part, Array& out) {
      dispatch_float(out.dtype(), op, [&](auto ot) {
        using O = decltype(ot);
        O* po = out.data<O>();
#pragma omp parallel for if (chunks * c > grain::copy) schedule(static)
        for (int64_t i = 0; i < c; ++i) {
          double s = 0;
          for (int64_t ch = 0; ch < chunks; ++ch) s += part[size_t(ch * c + i)];
          po[i] = store_f32<O>(float(s));
        }
      });
    };
    if (want_w) finish(part_w, *dweight);
    if (want_b) finish(part_b, *dbias);
  });
}

}  // namespace mt::cpu
