#include "meshtrain/backend/loss.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "meshtrain/backend/cpu/fast_math.h"
#include "meshtrain/core/element.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

namespace {


template <class I>
inline int64_t label_at(const Array& labels, int64_t i) {
  return int64_t(labels.data<I>()[i]);
}

inline int64_t label_of(const Array& labels, int64_t i) {
  return labels.dtype() == DType::i32 ? label_at<int32_t>(labels, i) : label_at<int64_t>(labels, i);
}

}  // namespace

void cross_entropy_forward(const Array& logits, const Array& labels, int64_t classes, int64_t ignore_index,
                           float smoothing, Array& loss, Array& lse) {
  const int64_t w = logits.shape()[logits.ndim() - 1], c = classes;  // row width, classes (c <= w)
  const int64_t n = w == 0 ? 0 : logits.numel() / w;
  float* pl = loss.data<float>();
  float* ps = lse.data<float>();
  dispatch_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const T* px = logits.data<T>();
#pragma omp parallel if (n * c > grain::compute && n > 1)
    {
      std::vector<float> buf(std::is_same_v<T, float> ? 0 : size_t(c));
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const float* row;
        if constexpr (std::is_same_v<T, float>) {
          row = px + i * w;
        } else {
          for (int64_t k = 0; k < c; ++k) buf[size_t(k)] = load_f32(px[i * w + k]);
          row = buf.data();
        }
        float m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (int64_t k = 0; k < c; ++k) m = row[k] > m ? row[k] : m;
        float s = 0.0f, sx = 0.0f;
#pragma omp simd reduction(+ : s, sx)
        for (int64_t k = 0; k < c; ++k) {
          s += fast_exp(row[k] - m);
          sx += row[k];
        }
        const double l = double(m) + std::log(double(s));
        ps[i] = float(l);
        const int64_t y = label_of(labels, i);
        if (y == ignore_index) {
          pl[i] = 0.0f;
          continue;
        }
        const double nll = l - double(row[y]);
        // Skipped without smoothing: a -inf (masked) logit makes the mean term infinite.
        const double smooth = smoothing > 0.0f ? l - double(sx) / double(c) : 0.0;
        pl[i] = float((1.0 - smoothing) * nll + (smoothing > 0.0f ? smoothing * smooth : 0.0));
      }
    }
  });
}

void cross_entropy_backward(const Array& logits, const Array& labels, int64_t classes, const Array& lse,
                            const Array& row_scale, int64_t ignore_index, float smoothing, Array& grad) {
  const int64_t w = logits.shape()[logits.ndim() - 1], c = classes;  // row width, classes (c <= w)
  const int64_t n = w == 0 ? 0 : logits.numel() / w;
  const float* ps = lse.data<float>();
  const float* pr = row_scale.data<float>();
  const float off = smoothing / float(c), hit = 1.0f - smoothing;
  dispatch_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const T* px = logits.data<T>();
    T* pg = grad.data<T>();
#pragma omp parallel if (n * c > grain::compute && n > 1)
    {
      std::vector<float> in_buf(std::is_same_v<T, float> ? 0 : size_t(c));
      std::vector<float> out_buf(std::is_same_v<T, float> ? 0 : size_t(c));
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t y = label_of(labels, i);
        for (int64_t k = c; k < w; ++k) pg[i * w + k] = store_f32<T>(0.0f);  // padding
        if (y == ignore_index) {
          for (int64_t k = 0; k < c; ++k) pg[i * w + k] = store_f32<T>(0.0f);
          continue;
        }
        const float* row;
        float* out;
        if constexpr (std::is_same_v<T, float>) {
          row = px + i * w;
          out = pg + i * w;
        } else {
          for (int64_t k = 0; k < c; ++k) in_buf[size_t(k)] = load_f32(px[i * w + k]);
          row = in_buf.data();
          out = out_buf.data();
        }
        const float l = ps[i], scale = pr[i];
#pragma omp simd
        for (int64_t k = 0; k < c; ++k) out[k] = (fast_exp(row[k] - l) - off) * scale;
        out[y] = (fast_exp(row[y] - l) - off - hit) * scale;
        if constexpr (!std::is_same_v<T, float>)
          for (int64_t k = 0; k < c; ++k) pg[i * w + k] = store_f32<T>(out[k]);
      }
    }
  });
}

void cross_entropy_count(const Array& labels, int64_t ignore_index, Array& count) {
  int64_t n = 0;
  for (int64_t j = 0; j < labels.numel(); ++j) n += label_of(labels, j) != ignore_index;
  count.data<int64_t>()[0] = n;
}

void cross_entropy_total(const Array& loss, const Array& count_array, bool mean, Array& out) {
  const int64_t count = count_array.data<int64_t>()[0];
  double total = 0.0;
  const float* pl = loss.data<float>();
  for (int64_t i = 0; i < loss.numel(); ++i) total += double(pl[i]);
  if (mean) total = count > 0 ? total / double(count) : std::numeric_limits<double>::quiet_NaN();
  out.data<float>()[0] = float(total);
}

}  // namespace mt::cpu
