#include "meshtrain/data/image_resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "meshtrain/core/error.h"

namespace mt::data {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // room for 8-bit values times the sum of weights

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}

// Each filter and its support (the half width at scale 1), as PIL defines them.
struct Filter {
  double support;
  double (*weight)(double);
};

double box_weight(double x) { return x > -0.5 && x <= 0.5 ? 1.0 : 0.0; }
double bilinear_weight(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}
double hamming_weight(double x) {
  x = std::fabs(x);
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x *= M_PI;
  return std::sin(x) / x * (0.54 + 0.46 * std::cos(x));
}
double bicubic_weight(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}
double lanczos_weight(double x) { return x >= -3.0 && x < 3.0 ? sinc(x) * sinc(x / 3.0) : 0.0; }

Filter filter_of(Resample r) {
  switch (r) {
    case Resample::box: return {0.5, box_weight};
    case Resample::bilinear: return {1.0, bilinear_weight};
    case Resample::hamming: return {1.0, hamming_weight};
    case Resample::bicubic: return {2.0, bicubic_weight};
    case Resample::lanczos: return {3.0, lanczos_weight};
    case Resample::nearest: break;
  }
  throw Error("[resize] nearest has no convolution filter");
}

// One axis's taps: output i reads `count[i]` inputs from `first[i]`, with fixed-point weights
// `k[i * width + j]`.
struct Taps {
  int64_t width = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> k;
};

Taps taps_for(int64_t in_size, int64_t out_size, const Filter& f) {
  const double scale = double(in_size) / double(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = f.support * filter_scale;
  Taps t;
  t.width = int64_t(std::ceil(support)) * 2 + 1;
  t.first.resize(size_t(out_size));
  t.count.resize(size_t(out_size));
  t.k.assign(size_t(out_size * t.width), 0);
  std::vector<double> w(size_t(t.width));
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = (double(i) + 0.5) * scale;
    // Truncation toward zero, then clamped: PIL's bounds.
    int64_t lo = int64_t(center - support + 0.5);
    if (lo < 0) lo = 0;
    int64_t hi = int64_t(center + support + 0.5);
    if (hi > in_size) hi = in_size;
    const int64_t n = hi - lo;
    double total = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      w[size_t(j)] = f.weight((double(j + lo) - center + 0.5) / filter_scale);
      total += w[size_t(j)];
    }
    for (int64_t j = 0; j < n; ++j) {
      const double v = total != 0.0 ? w[size_t(j)] / total : w[size_t(j)];
      t.k[size_t(i * t.width + j)] = int32_t(v < 0 ? -0.5 + v * (1 << kPrecisionBits) : 0.5 + v * (1 << kPrecisionBits));
    }
    t.first[size_t(i)] = lo;
    t.count[size_t(i)] = n;
  }
  return t;
}

uint8_t clip8(int64_t v) {
  if (v >= (int64_t(1) << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return uint8_t(v >> kPrecisionBits);
}

// Along x: each output pixel's three channels from its taps in one pass over the row.
Image resample_horizontal(const Image& in, int64_t out_width, const Filter& f) {
  const Taps t = taps_for(in.width, out_width, f);
  Image out;
  out.width = out_width, out.height = in.height;
  out.rgb.resize(size_t(out.width * out.height * 3));
  for (int64_t y = 0; y < in.height; ++y) {
    const uint8_t* row = in.rgb.data() + size_t(y * in.width * 3);
    uint8_t* o = out.rgb.data() + size_t(y * out_width * 3);
    for (int64_t x = 0; x < out_width; ++x) {
      const int32_t* k = &t.k[size_t(x * t.width)];
      const uint8_t* src = row + t.first[size_t(x)] * 3;
      int64_t r = int64_t(1) << (kPrecisionBits - 1), g = r, b = r;
      for (int64_t j = 0; j < t.count[size_t(x)]; ++j) {
        r += int64_t(src[3 * j]) * k[j];
        g += int64_t(src[3 * j + 1]) * k[j];
        b += int64_t(src[3 * j + 2]) * k[j];
      }
      o[3 * x] = clip8(r), o[3 * x + 1] = clip8(g), o[3 * x + 2] = clip8(b);
    }
  }
  return out;
}

// Along y: each output row is a weighted sum of whole input rows (contiguous, vectorizable).
Image resample_vertical(const Image& in, int64_t out_height, const Filter& f) {
  const Taps t = taps_for(in.height, out_height, f);
  Image out;
  out.width = in.width, out.height = out_height;
  out.rgb.resize(size_t(out.width * out.height * 3));
  const int64_t n = in.width * 3;
  std::vector<int64_t> acc(static_cast<size_t>(n));
  for (int64_t y = 0; y < out_height; ++y) {
    std::fill(acc.begin(), acc.end(), int64_t(1) << (kPrecisionBits - 1));
    const int32_t* k = &t.k[size_t(y * t.width)];
    for (int64_t j = 0; j < t.count[size_t(y)]; ++j) {
      const uint8_t* src = in.rgb.data() + size_t((t.first[size_t(y)] + j) * n);
      const int64_t w = k[j];
      for (int64_t i = 0; i < n; ++i) acc[size_t(i)] += int64_t(src[i]) * w;
    }
    uint8_t* o = out.rgb.data() + size_t(y * n);
    for (int64_t i = 0; i < n; ++i) o[i] = clip8(acc[size_t(i)]);
  }
  return out;
}

Image resample_axis(const Image& in, int64_t out_size, bool horizontal, const Filter& f) {
  return horizontal ? resample_horizontal(in, out_size, f) : resample_vertical(in, out_size, f);
}

// PIL's scale-only affine transform: the source coordinate of each output centre accumulated
// step by step in double (x0 + s/2, then + s per pixel) and truncated, as PIL walks it; the
// accumulation's rounding decides the pixels that fall on a boundary.
std::vector<int64_t> nearest_sources(int64_t in_size, int64_t out_size) {
  const double step = double(in_size) / double(out_size);
  std::vector<int64_t> src(static_cast<size_t>(out_size));
  double at = step * 0.5;
  for (int64_t i = 0; i < out_size; ++i, at += step) src[size_t(i)] = std::min(int64_t(at), in_size - 1);
  return src;
}

Image resize_nearest(const Image& in, int64_t width, int64_t height) {
  Image out;
  out.width = width, out.height = height;
  out.rgb.resize(size_t(width * height * 3));
  const std::vector<int64_t> xs = nearest_sources(in.width, width), ys = nearest_sources(in.height, height);
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) out.rgb[size_t((y * width + x) * 3 + c)] = in.at(ys[size_t(y)], xs[size_t(x)], c);
  return out;
}

}  // namespace

Resample resample_from_code(int code) {
  MT_CHECK(code >= 0 && code <= 5, "[image processor] resample ", code,
           " is not one of PIL's filters (0 nearest, 1 lanczos, 2 bilinear, 3 bicubic, 4 box, 5 hamming)");
  return Resample(code);
}

const char* resample_name(Resample r) {
  switch (r) {
    case Resample::nearest: return "nearest";
    case Resample::lanczos: return "lanczos";
    case Resample::bilinear: return "bilinear";
    case Resample::bicubic: return "bicubic";
    case Resample::box: return "box";
    case Resample::hamming: return "hamming";
  }
  return "?";
}

Image resize_image(const Image& image, int64_t width, int64_t height, Resample resample) {
  MT_CHECK(width > 0 && height > 0, "[resize] target size ", width, "x", height, " must be positive");
  MT_CHECK(image.width > 0 && image.height > 0, "[resize] the image is empty (", image.size_str(), ")");
  if (width == image.width && height == image.height) return image;
  if (resample == Resample::nearest) return resize_nearest(image, width, height);
  const Filter f = filter_of(resample);
  // PIL: horizontal first (only where the width changes), then vertical.
  if (width != image.width && height != image.height)
    return resample_axis(resample_axis(image, width, true, f), height, false, f);
  if (width != image.width) return resample_axis(image, width, true, f);
  return resample_axis(image, height, false, f);
}

}  // namespace mt::data
