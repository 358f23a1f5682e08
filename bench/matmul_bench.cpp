// Compares the engine's mt::matmul op (checks, output allocation, oneDNN kernel with its
// primitive cache) with oneDNN called directly (primitive created once, executed in a loop)
// on transformer-sized GEMMs: what the engine costs on top of oneDNN.
// A dtype oneDNN has no kernel for on this CPU (bf16 below AVX-512) has no direct column:
// its row shows the engine's widened-to-f32 path.
// Usage: matmul_bench [--quick]   (MESHTRAIN_MAX_CPU_ISA=avx2 runs it as on an AVX2-only CPU)
#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/backend/cpu/matmul_kernel.h"
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

using mt::cpu::MatmulDType;
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
Result measure(MatmulDType dtype, const Shape& s, double budget_s, bool with_direct) {
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
    if (c_direct != c_ours) std::printf("  WARNING: outputs differ for M=%ld\n", long(s.M));
  }
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const double budget = quick ? 0.3 : 1.5;  // seconds of timed calls per (dtype, shape)
  const Shape shapes[] = {{1024, 768, 768},  {1024, 3072, 768}, {1024, 768, 3072},
                          {2048, 768, 768},  {4096, 1024, 1024}, {512, 512, 512}};
  const Shape tiny[] = {{16, 16, 16}, {64, 64, 64}, {128, 128, 128}};

  // First: it applies any instruction-set cap before oneDNN is used below.
  const mt::cpu::CpuFeatures& cpu = mt::cpu::cpu_features();
  std::printf("oneDNN %d.%d.%d; %s; f16 matmul: %s\n\n", dnnl_version()->major, dnnl_version()->minor,
              dnnl_version()->patch, mt::cpu::cpu_summary().c_str(), cpu.f16_gemm_native ? "native" : "widened to f32");
  std::printf("%-5s %5s %5s %5s | %12s %12s | %9s\n", "dtype", "M", "N", "K", "direct GF/s", "mt GF/s", "mt/direct");
  for (MatmulDType d : {MatmulDType::f32, MatmulDType::bf16}) {
    const bool direct = d == MatmulDType::f32 || cpu.bf16_gemm_native;
    for (const Shape& s : shapes) {
      const Result r = measure(d, s, budget, direct);
      std::printf("%-5s %5ld %5ld %5ld | ", d == MatmulDType::f32 ? "f32" : "bf16", long(s.M), long(s.N), long(s.K));
      if (direct)
        std::printf("%12.1f %12.1f | %9.3f\n", r.direct_gflops, r.ours_gflops, r.ours_gflops / r.direct_gflops);
      else
        std::printf("%12s %12.1f | %9s\n", "n/a", r.ours_gflops, "n/a");
      std::fflush(stdout);
    }
    if (!direct) std::printf("(bf16 direct: n/a (no native bf16 on this CPU); mt: %s)\n", mt::cpu::bf16_gemm_mode().c_str());
  }

  // Small shapes expose fixed per-call overhead (lookup, handle rebinding, execute).
  std::printf("\nper-call time on small shapes (f32)\n%5s %5s %5s | %10s %10s | %9s\n", "M", "N",
              "K", "direct us", "ours us", "delta us");
  for (const Shape& s : tiny) {
    const Result r = measure(MatmulDType::f32, s, budget / 3, true);
    std::printf("%5ld %5ld %5ld | %10.2f %10.2f | %9.2f\n", long(s.M), long(s.N), long(s.K),
                r.direct_us, r.ours_us, r.ours_us - r.direct_us);
  }

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
