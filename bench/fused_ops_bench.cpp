// The fused layer ops a training step runs between its GEMMs, forward and forward + backward,
// in f32 and bf16 on the same shape: milliseconds per call (median of 7 after a warm-up) and
// the bytes each moves per second. bf16 arrays hold half the bytes, so a bf16 call should
// take no longer than an f32 one; where it does, its conversions, not memory, set the pace.
// Usage: fused_ops_bench [ROWS WIDTH]   (default 1024 768: BERT-base at batch 8 x 128)
//        MT_OP=substring times only the ops whose name holds it; MT_DTYPE=f32|bf16 one dtype
//        (to profile one kernel).
#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/meshtrain.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

using namespace mt;

double median_ms(const std::function<void()>& fn) {
  fn();  // warm-up: allocations, first-touch
  std::vector<double> ms;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Op {
  std::string name;
  int arrays;  // (rows, width) arrays read or written by the forward; the backward moves as many again and more
  std::function<Array(const std::vector<Array>&)> fn;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 1 && argc != 3) {
    std::fprintf(stderr, "usage: fused_ops_bench [ROWS WIDTH]\n");
    return 2;
  }
  const int64_t rows = argc == 3 ? std::stoll(argv[1]) : 1024, width = argc == 3 ? std::stoll(argv[2]) : 768;
  std::printf("%s; rows %lld, width %lld\n", cpu::cpu_summary().c_str(), (long long)rows, (long long)width);
  const RngKey key{5, 9};
  std::vector<Op> ops = {
      {"add_dropout_layer_norm (p 0.1)", 4,
       [&](const std::vector<Array>& v) { return add_dropout_layer_norm(v[0], v[1], v[2], v[3], 1e-12, 0.1, key); }},
      {"add_dropout_layer_norm (p 0)", 4,
       [&](const std::vector<Array>& v) { return add_dropout_layer_norm(v[0], v[1], v[2], v[3], 1e-12, 0.0, key); }},
      {"bias_activation gelu", 2,
       [&](const std::vector<Array>& v) { return bias_activation(v[0], v[3], FusedActivation::gelu); }},
      {"add_dropout (p 0.1)", 3, [&](const std::vector<Array>& v) { return add_dropout(v[0], v[1], 0.1, key); }},
      {"layer_norm", 2, [&](const std::vector<Array>& v) { return layer_norm(v[0], v[2], v[3], 1e-12); }},
  };
  std::printf("%-34s %6s %10s %10s %12s %12s\n", "op", "dtype", "fwd ms", "fwd+bwd ms", "fwd GB/s", "vs f32 fwd+bwd");
  const char* only_op = std::getenv("MT_OP");
  const char* only_dtype = std::getenv("MT_DTYPE");
  for (const Op& op : ops) {
    if (only_op && op.name.find(only_op) == std::string::npos) continue;
    double f32_total = 0;
    for (DType dtype : {DType::f32, DType::bf16}) {
      if (only_dtype && dtype_name(dtype) != std::string(only_dtype)) continue;
      // Activations in the step's dtype; the norm's weight and the bias stay f32 (master weights).
      std::vector<Array> in = {cast(random_normal(RngKey{1, 1}, {rows, width}), dtype),
                               cast(random_normal(RngKey{1, 2}, {rows, width}), dtype),
                               random_normal(RngKey{1, 3}, {width}), random_normal(RngKey{1, 4}, {width})};
      const Array cot = cast(random_normal(RngKey{1, 5}, {rows, width}), dtype);
      const double fwd = median_ms([&] {
        autodiff::NoGradGuard no_grad;
        op.fn(in);
      });
      const double both = median_ms([&] { vjp(op.fn, in, cot); });
      if (dtype == DType::f32 || f32_total == 0) f32_total = both;
      const double bytes = double(op.arrays) * double(rows * width) * double(dtype_size(dtype));
      std::printf("%-34s %6s %10.3f %10.3f %12.1f %11.2fx\n", op.name.c_str(), dtype_name(dtype), fwd, both,
                  bytes / (fwd * 1e-3) / 1e9, both / f32_total);
    }
  }
  return 0;
}
