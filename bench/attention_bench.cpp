// Causal self-attention forward + backward, composed (GEMMs, fused causal softmax, dropout)
// against the fused flash_attention primitive, on model-sized shapes: milliseconds per call
// (median of 5 after a warm-up), the attention FLOPs rate and the bytes each form keeps
// between forward and backward (the allocator's peak during the forward minus its inputs).
// Usage: attention_bench [B H T D ...]   (defaults: GPT-2 124M and the seed miniGPT)
// MT_DEVICE=cuda runs on the GPU (each call timed to completion); MT_PRECISION=tf32|bf16 sets
// the matmul precision (the composed form's GEMMs, the fused kernels' tensor-core operands);
// MT_DTYPE=bf16 makes the arrays bf16 (a bf16 training step's); MT_NO_DROPOUT=1 drops dropout;
// MT_FORM=fused|composed times one form only (to profile it). MT_ATTENTION_CUDNN=1 (=all: with
// dropout too) lets cuDNN's fused engine run the fused form where it takes the arrays
// (cuda/cudnn_attention.h): the last line says how many forwards it ran and, if it refused a
// shape, why.
#include "meshtrain/backend/attention.h"
#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/meshtrain.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace mt;

struct Case {
  int64_t b, h, t, d;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(const Case& c, AttentionKernel kernel) {
  set_attention_kernel(kernel);
  const Shape shape{c.b, c.h, c.t, c.d};
  // MT_DTYPE=bf16: bf16 arrays, as a bf16 training step hands the attention (f32 by default).
  const char* dtype_env = std::getenv("MT_DTYPE");
  const DType dtype = dtype_env && std::string(dtype_env) == "bf16" ? DType::bf16 : DType::f32;
  auto draw = [&](uint64_t i) { return cast(random_normal(RngKey{1, i}, shape), dtype); };
  Params in{{"q", draw(0)}, {"k", draw(1)}, {"v", draw(2)}};
  const Array cot = draw(3);
  AttentionOptions o;
  o.causal = true, o.train = true, o.dropout_rate = std::getenv("MT_NO_DROPOUT") ? 0.0 : 0.1, o.dropout_key = RngKey{2, 0};
  auto loss = [&](const Params& p) { return sum(mul(scaled_dot_product_attention(p["q"], p["k"], p["v"], Array(), o), cot)); };
  std::vector<double> times;
  size_t kept = 0;
  CachingAllocator& alloc = CachingAllocator::instance();
  for (int i = 0; i < 6; ++i) {
    alloc.reset_peak();
    const size_t before = alloc.stats().bytes_in_use;
    const auto t0 = std::chrono::steady_clock::now();
    auto [l, g] = value_and_grad(loss)(in);
    l.item();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    kept = alloc.stats().peak_bytes_in_use - before;
  }
  times.erase(times.begin());
  const double s = median(times);
  // Causal: about half the (T, T) products; forward 2 GEMMs, backward 4 (+1 recompute fused).
  const double flops = 6.0 * 2.0 * double(c.b * c.h) * double(c.t) * double(c.t + 1) / 2.0 * double(c.d);
  std::printf("  %-8s B%-3lld H%-3lld T%-5lld D%-4lld %8.2f ms  %7.1f GFLOP/s  peak +%6.1f MB\n",
              kernel == AttentionKernel::fused ? "fused" : "composed", (long long)c.b, (long long)c.h,
              (long long)c.t, (long long)c.d, 1e3 * s, flops / s / 1e9, double(kept) / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Case> cases;
  for (int i = 1; i + 3 < argc; i += 4)
    cases.push_back({std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2]), std::atoll(argv[i + 3])});
  if (cases.empty()) cases = {{4, 12, 256, 64}, {8, 8, 256, 32}, {8, 12, 128, 64}, {1, 12, 1024, 64}};
  const char* device_name = std::getenv("MT_DEVICE");
  const char* precision_name = std::getenv("MT_PRECISION");
  const Device device = Device::parse(device_name ? device_name : "cpu");
  set_default_device(device);
  MatmulPrecisionScope precision(matmul_precision_from_name(precision_name ? precision_name : "f32"));
  const char* dtype_env = std::getenv("MT_DTYPE");
  std::printf("causal attention with dropout %s, %s arrays, forward + backward, %s matmuls, on %s\n",
              std::getenv("MT_NO_DROPOUT") ? "0" : "0.1", dtype_env ? dtype_env : "f32",
              matmul_precision_name(matmul_precision()),
              device.is_cpu() ? cpu::cpu_summary().c_str() : device.str().c_str());
  const char* form = std::getenv("MT_FORM");
  for (const Case& c : cases) {
    if (!form || std::string(form) != "fused") run(c, AttentionKernel::composed);
    if (!form || std::string(form) != "composed") run(c, AttentionKernel::fused);
  }
  if (const char* v = std::getenv("MT_ATTENTION_CUDNN"); v && (std::string(v) == "1" || std::string(v) == "all")) {
    const std::string refusal = cuda::cudnn_attention_last_refusal();
    std::printf("cuDNN ran %llu forwards and %llu backwards%s%s\n",
                (unsigned long long)cuda::cudnn_attention_forwards(),
                (unsigned long long)cuda::cudnn_attention_backwards(), refusal.empty() ? "" : "; refused: ",
                refusal.c_str());
  }
  return 0;
}
