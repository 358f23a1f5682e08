// Compares the engine's mt::matmul op (checks, output allocation, oneDNN kernel with its
// primitive cache) with oneDNN called directly (primitive created once, executed in a loop)
// on transformer-sized GEMMs: what the engine costs on top of oneDNN. (f32 runs oneDNN's jit
// GEMM where that is faster than the primitive; the last table shows by how much.)
// A dtype oneDNN has no kernel for on this CPU (bf16 below AVX-512) has no direct column:
// its row shows the engine's widened-to-f32 path.
// Usage: matmul_bench [--quick]   (MESHTRAIN_MAX_CPU_ISA=avx2 runs it as on an AVX2-only CPU)
#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/backend/matmul.h"
#include "meshtrain/meshtrain.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using mt::kernels::MatmulDType;
using clock_type = std::chrono::steady_clock;

struct Shape {
  int64_t M, N, K;
};

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Random data in the dtype's storage; 16-bit types hold raw bf16/f16 bits.
std::vector<uint8_t> random_buffer(MatmulDType d, size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const size_t es = d == MatmulDType::f32 ? 4 : 2;
  std::vector<uint8_t> buf(n * es);
  for (size_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    if (d == MatmulDType::f32) {
      std::memcpy(&buf[i * 4], &v, 4);
    } else {
      const uint16_t h = d == MatmulDType::bf16 ? uint16_t(std::bit_cast<uint32_t>(v) >> 16)
                                                : mt::f32_to_f16(v).bits;
      std::memcpy(&buf[i * 2], &h, 2);
    }
  }
  return buf;
}

struct Result {
  double direct_gflops = 0, ours_gflops = 0, direct_us = 0, ours_us = 0;
};

// Times direct oneDNN and mt::matmul call by call, interleaved so machine noise hits
// both alike; reports the median of each.
// same_sums: mt::matmul runs oneDNN's own kernel for this product, so the outputs must be
// equal bit for bit (a widened product sums in another order).
Result measure(MatmulDType dtype, const Shape& s, double budget_s, bool with_direct, bool same_sums = true) {
  std::mt19937 rng(42);
  auto a = random_buffer(dtype, size_t(s.M * s.K), rng);  // (M, K)
  auto b = random_buffer(dtype, size_t(s.K * s.N), rng);  // (K, N)
  std::vector<uint8_t> c_direct(size_t(s.M * s.N) * (dtype == MatmulDType::f32 ? 4 : 2));
  std::vector<uint8_t> c_ours(c_direct.size());

  // The plain oneDNN recipe: create once, execute many.
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  dnnl::matmul prim;
  dnnl::memory ma, mb, mc;
  if (with_direct) {
    const auto dt = dtype == MatmulDType::f32    ? dnnl::memory::data_type::f32
                    : dtype == MatmulDType::bf16 ? dnnl::memory::data_type::bf16
                                                 : dnnl::memory::data_type::f16;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc a_md({s.M, s.K}, dt, tag::ab), b_md({s.K, s.N}, dt, tag::ab),
        c_md({s.M, s.N}, dt, tag::ab);
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng));
    ma = dnnl::memory(a_md, eng, a.data());
    mb = dnnl::memory(b_md, eng, b.data());
    mc = dnnl::memory(c_md, eng, c_direct.data());
  }
  auto run_direct = [&] {
    prim.execute(strm, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    strm.wait();
  };
  const mt::DType mdt = dtype == MatmulDType::f32    ? mt::DType::f32
                        : dtype == MatmulDType::bf16 ? mt::DType::bf16
                                                     : mt::DType::f16;
  mt::Array a_arr = mt::Array::empty({s.M, s.K}, mdt), b_arr = mt::Array::empty({s.K, s.N}, mdt);
  std::memcpy(a_arr.raw(), a.data(), a_arr.nbytes());
  std::memcpy(b_arr.raw(), b.data(), b_arr.nbytes());
  mt::Array c_arr;
  auto run_ours = [&] { c_arr = mt::matmul(a_arr, b_arr); };

  // Warm-up: JIT/primitive creation, caches, OpenMP thread pool.
  for (int i = 0; i < 3; ++i) {
    if (with_direct) run_direct();
    run_ours();
  }
  auto t_probe = clock_type::now();
  run_ours();
  const double one = std::max(seconds_since(t_probe), 1e-7);
  const int reps = int(std::clamp(budget_s / (one * (with_direct ? 2 : 1)), 15.0, 20000.0));

  std::vector<double> t_direct, t_ours;
  for (int r = 0; r < reps; ++r) {
    if (with_direct) {
      auto t0 = clock_type::now();
      run_direct();
      t_direct.push_back(seconds_since(t0));
    }
    auto t0 = clock_type::now();
    run_ours();
    t_ours.push_back(seconds_since(t0));
  }
  const double flops = 2.0 * double(s.M) * double(s.N) * double(s.K);
  Result res;
  res.ours_us = median(t_ours) * 1e6;
  res.ours_gflops = flops / median(t_ours) * 1e-9;
  if (with_direct) {
    res.direct_us = median(t_direct) * 1e6;
    res.direct_gflops = flops / median(t_direct) * 1e-9;
    std::memcpy(c_ours.data(), c_arr.raw(), c_ours.size());
    // f32 runs oneDNN's jit GEMM, not this primitive (prefers_jit_sgemm): sums may round
    // differently, so only the 16-bit rows must match bit for bit.
    if (dtype != MatmulDType::f32 && same_sums && c_direct != c_ours) std::printf("  WARNING: outputs differ for M=%ld\n", long(s.M));
  }
  return res;
}

// The f32 shapes of a GPT-2 / BERT training step with their stored layouts (weights as
// (out, in), gradients as xᵀ·g): oneDNN's matmul primitive against its jit GEMM
// (dnnl_sgemm), the choice behind cpu/matmul.cpp's prefers_jit_sgemm.
struct LayoutShape {
  int64_t M, N, K;
  bool ta, tb;
  const char* what;
};

void compare_primitive_and_sgemm(double budget_s) {
  const LayoutShape shapes[] = {
      {1024, 3072, 768, false, true, "FFN in, forward"},      {1024, 3072, 768, false, false, "FFN out, dx"},
      {768, 3072, 1024, true, false, "FFN out, dW"},           {1024, 768, 3072, false, true, "FFN out, forward"},
      {1024, 768, 3072, false, false, "FFN in, dx"},           {3072, 768, 1024, true, false, "FFN in, dW"},
      {1024, 2304, 768, false, false, "QKV (K, N) weight"},    {1024, 50257, 768, false, true, "LM head, forward"},
      {50257, 768, 1024, true, false, "LM head, dW"},          {1024, 768, 50257, false, false, "LM head, dx"},
      {16, 768, 768, false, true, "decode, 16 rows"},          {1, 768, 768, false, true, "decode, 1 row"},
      {16, 3072, 768, false, false, "decode, 16 rows, (K, N)"}};
  std::printf("\nf32 layouts: oneDNN matmul primitive vs jit GEMM (GFLOP/s)\n%-26s %5s %5s %5s %2s %2s | %14s %9s\n",
              "shape", "M", "N", "K", "ta", "tb", "primitive", "sgemm");
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  for (const LayoutShape& s : shapes) {
    using dims = dnnl::memory::dims;
    const auto f32 = dnnl::memory::data_type::f32;
    const dnnl::memory::desc a_md({s.M, s.K}, f32, s.ta ? dims{1, s.M} : dims{s.K, 1});
    const dnnl::memory::desc b_md({s.K, s.N}, f32, s.tb ? dims{1, s.K} : dims{s.N, 1});
    const dnnl::memory::desc c_md({s.M, s.N}, f32, dims{s.N, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), eng);
    const dnnl::matmul prim(pd);
    std::vector<float> a(size_t(s.M * s.K), 0.5f), b(size_t(s.K * s.N), 0.25f), c(size_t(s.M * s.N));
    dnnl::memory ma(a_md, eng, a.data()), mb(b_md, eng, b.data()), mc(c_md, eng, c.data());
    auto time_of = [&](auto&& fn) {
      for (int i = 0; i < 2; ++i) fn();
      std::vector<double> t;
      const auto start = clock_type::now();
      while (t.size() < 5 || (seconds_since(start) < budget_s && t.size() < 200)) {
        const auto t0 = clock_type::now();
        fn();
        t.push_back(seconds_since(t0));
      }
      return 2.0 * double(s.M) * double(s.N) * double(s.K) / median(t) * 1e-9;
    };
    const double p = time_of([&] {
      prim.execute(strm, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
      strm.wait();
    });
    const double g = time_of([&] {
      dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.0f, a.data(), s.ta ? s.M : s.K, b.data(),
                 s.tb ? s.K : s.N, 0.0f, c.data(), s.N);
    });
    std::printf("%-26s %5ld %5ld %5ld %2d %2d | %6.1f %-7s %9.1f\n", s.what, long(s.M), long(s.N), long(s.K), int(s.ta),
                int(s.tb), p, pd.impl_info_str(), g);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const double budget = quick ? 0.3 : 1.5;  // seconds of timed calls per (dtype, shape)
  const Shape shapes[] = {{1024, 768, 768},  {1024, 3072, 768}, {1024, 768, 3072},
                          {2048, 768, 768},  {4096, 1024, 1024}, {512, 512, 512}};
  const Shape tiny[] = {{16, 16, 16}, {64, 64, 64}, {128, 128, 128}};
  // Where the bf16 GEMM route depends on the shape (a slow AVX512_BF16 dot product): decode's
  // matrix-vector products and small batches up to a training step's, oneDNN's bf16 kernel
  // (direct) against the route mt::matmul takes.
  const Shape routes[] = {{1, 768, 768},   {1, 3072, 768},   {8, 768, 768},     {32, 768, 768},
                          {64, 768, 768},  {128, 768, 768},  {256, 768, 768},   {512, 768, 768},
                          {1, 50257, 768}, {64, 50257, 768}, {1024, 50257, 768}};

  // First: it applies any instruction-set cap before oneDNN is used below.
  const mt::cpu::CpuFeatures& cpu = mt::cpu::cpu_features();
  std::printf("oneDNN %d.%d.%d; %s; f16 matmul: %s\n", dnnl_version()->major, dnnl_version()->minor,
              dnnl_version()->patch, mt::cpu::cpu_summary().c_str(), cpu.f16_gemm_native ? "native" : "widened to f32");
  if (cpu.bf16_dot_rate > 0) std::printf("bf16 dot product measured at %.2fx the f32 FMA's rate\n", cpu.bf16_dot_rate);
  std::printf("\n");
  std::printf("%-5s %5s %5s %5s | %12s %12s | %9s\n", "dtype", "M", "N", "K", "direct GF/s", "mt GF/s", "mt/direct");
  for (MatmulDType d : {MatmulDType::f32, MatmulDType::bf16}) {
    const bool direct = d == MatmulDType::f32 || cpu.bf16_gemm_onednn;
    for (const Shape& s : shapes) {
      const Result r = measure(d, s, budget, direct, d == MatmulDType::f32 || cpu.bf16_gemm_native);
      std::printf("%-5s %5ld %5ld %5ld | ", d == MatmulDType::f32 ? "f32" : "bf16", long(s.M), long(s.N), long(s.K));
      if (direct)
        std::printf("%12.1f %12.1f | %9.3f\n", r.direct_gflops, r.ours_gflops, r.ours_gflops / r.direct_gflops);
      else
        std::printf("%12s %12.1f | %9s\n", "n/a", r.ours_gflops, "n/a");
      std::fflush(stdout);
    }
    if (!direct) std::printf("(bf16 direct: n/a (no native bf16 on this CPU); mt: %s)\n", mt::cpu::bf16_gemm_mode().c_str());
  }

  if (cpu.bf16_gemm_onednn && !cpu.bf16_gemm_native) {
    std::printf("\nbf16 by shape: oneDNN's bf16 kernel (direct) against mt::matmul's route (%s)\n",
                mt::cpu::bf16_gemm_mode().c_str());
    std::printf("%5s %5s %5s | %12s %12s | %9s\n", "M", "N", "K", "direct GF/s", "mt GF/s", "mt/direct");
    for (const Shape& s : routes) {
      const Result r = measure(MatmulDType::bf16, s, budget / 2, true, false);
      std::printf("%5ld %5ld %5ld | %12.1f %12.1f | %9.3f\n", long(s.M), long(s.N), long(s.K), r.direct_gflops,
                  r.ours_gflops, r.ours_gflops / r.direct_gflops);
      std::fflush(stdout);
    }
  }

  // Small shapes expose fixed per-call overhead (lookup, handle rebinding, execute).
  std::printf("\nper-call time on small shapes (f32)\n%5s %5s %5s | %10s %10s | %9s\n", "M", "N",
              "K", "direct us", "ours us", "delta us");
  for (const Shape& s : tiny) {
    const Result r = measure(MatmulDType::f32, s, budget / 3, true);
    std::printf("%5ld %5ld %5ld | %10.2f %10.2f | %9.2f\n", long(s.M), long(s.N), long(s.K),
                r.direct_us, r.ours_us, r.ours_us - r.direct_us);
  }

  compare_primitive_and_sgemm(budget / 2);

  if (!cpu.f16_gemm_native) {
    std::printf("\nf16 via f32 fallback (ours only)\n%5s %5s %5s | %12s\n", "M", "N", "K",
                "ours GF/s");
    for (const Shape& s : shapes) {
      const Result r = measure(MatmulDType::f16, s, budget / 2, false);
      std::printf("%5ld %5ld %5ld | %12.1f\n", long(s.M), long(s.N), long(s.K), r.ours_gflops);
      std::fflush(stdout);
    }
  }
  return 0;
}
