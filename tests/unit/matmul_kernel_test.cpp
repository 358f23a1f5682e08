// Checks mt::cpu::matmul against a double-precision triple loop for every dtype, transpose
// combination, batch-broadcast mode and accumulate flag, plus edge cases and the f16 helpers.
#include "meshtrain/backend/matmul.h"
#include "meshtrain/core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

uint16_t float_to_half_bits(float f) { return mt::f32_to_f16(f).bits; }
float half_bits_to_float(uint16_t h) { return mt::f16_to_f32(mt::f16{h}); }

using mt::kernels::MatmulDType;

uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (test data has no NaNs)
  return uint16_t(u >> 16);
}
float bf16_bits_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

const char* name(MatmulDType d) {
  return d == MatmulDType::f32 ? "f32" : d == MatmulDType::bf16 ? "bf16" : d == MatmulDType::f16 ? "f16" : "f32 as bf16";
}

// f32_as_bf16 reads f32 buffers and writes an f32 output.
MatmulDType output_dtype(MatmulDType d) { return d == MatmulDType::f32_as_bf16 ? MatmulDType::f32 : d; }

// A buffer of one dtype, with its values as the doubles the kernel actually sees.
struct Buffer {
  MatmulDType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  std::vector<double> value;

  Buffer(MatmulDType d, size_t n, std::mt19937& rng) : dtype(d), value(n) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    if (d == MatmulDType::f32 || d == MatmulDType::f32_as_bf16) f32.resize(n);
    else u16.resize(n);
    for (size_t i = 0; i < n; ++i) set(i, dist(rng));
  }
  void set(size_t i, float v) {
    if (dtype == MatmulDType::f32) {
      f32[i] = v;
      value[i] = v;
    } else if (dtype == MatmulDType::f32_as_bf16) {
      f32[i] = v;  // the kernel sees v rounded to bf16
      value[i] = bf16_bits_to_f32(f32_to_bf16_bits(v));
    } else if (dtype == MatmulDType::bf16) {
      u16[i] = f32_to_bf16_bits(v);
      value[i] = bf16_bits_to_f32(u16[i]);
    } else {
      u16[i] = float_to_half_bits(v);
      value[i] = half_bits_to_float(u16[i]);
    }
  }
  double get(size_t i) const {
    if (dtype == MatmulDType::f32 || dtype == MatmulDType::f32_as_bf16) return f32[i];
    if (dtype == MatmulDType::bf16) return bf16_bits_to_f32(u16[i]);
    return half_bits_to_float(u16[i]);
  }
  void* data() { return f32.empty() ? static_cast<void*>(u16.data()) : f32.data(); }
};

double tolerance(MatmulDType d) {
  // Relative to sum_k |a||b| (+|c|), the natural scale of rounding error in a dot product;
  // bf16/f16 outputs are rounded once to 8 / 11 significant bits.
  return d == MatmulDType::f32 || d == MatmulDType::f32_as_bf16 ? 1e-5 : d == MatmulDType::bf16 ? 1e-2 : 2e-3;
}

struct Case {
  MatmulDType dtype;
  int64_t batch, batch_a, batch_b, M, N, K;
  bool trans_a, trans_b, accumulate;
};

std::string describe(const Case& c) {
  return std::string(name(c.dtype)) + " batch=" + std::to_string(c.batch) +
         " batch_a=" + std::to_string(c.batch_a) + " batch_b=" + std::to_string(c.batch_b) +
         " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " ta=" + std::to_string(c.trans_a) + " tb=" + std::to_string(c.trans_b) +
         " acc=" + std::to_string(c.accumulate);
}

// Runs one case and compares every output element with the double reference.
void check_case(const Case& cs, uint32_t seed = 1) {
  SCOPED_TRACE(describe(cs));
  std::mt19937 rng(seed);
  const int64_t M = cs.M, N = cs.N, K = cs.K;
  Buffer a(cs.dtype, size_t(cs.batch_a * M * K), rng);  // (Ba, M, K) or (Ba, K, M)
  Buffer b(cs.dtype, size_t(cs.batch_b * K * N), rng);  // (Bb, K, N) or (Bb, N, K)
  Buffer c(output_dtype(cs.dtype), size_t(cs.batch * M * N), rng);  // (B, M, N)
  const std::vector<double> c0 = c.value;
  const std::vector<float> a_before = a.f32, b_before = b.f32;

  mt::cpu::matmul(cs.dtype, a.data(), b.data(), c.data(), cs.batch, cs.batch_a, cs.batch_b, M, N,
                  K, cs.trans_a, cs.trans_b, cs.accumulate);

  EXPECT_TRUE(a.f32 == a_before && b.f32 == b_before) << "the kernel wrote into its inputs";
  const double tol = tolerance(cs.dtype);
  int failures = 0;
  for (int64_t bi = 0; bi < cs.batch; ++bi) {
    const size_t a_off = size_t(cs.batch_a == 1 ? 0 : bi) * M * K;
    const size_t b_off = size_t(cs.batch_b == 1 ? 0 : bi) * K * N;
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        double ref = 0.0, scale = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          const double av = a.value[a_off + (cs.trans_a ? k * M + i : i * K + k)];
          const double bv = b.value[b_off + (cs.trans_b ? j * K + k : k * N + j)];
          ref += av * bv;
          scale += std::fabs(av * bv);
        }
        const size_t ci = size_t((bi * M + i) * N + j);
        if (cs.accumulate) {
          ref += c0[ci];
          scale += std::fabs(c0[ci]);
        }
        const double got = c.get(ci);
        if (!(std::fabs(got - ref) <= tol * scale + 1e-30) && failures++ < 5) {
          ADD_FAILURE() << "at [" << bi << "," << i << "," << j << "]: got " << got << " want "
                        << ref << " (scale " << scale << ")";
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

struct Shape {
  int64_t M, N, K;
};
const Shape kShapes[] = {{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {64, 48, 32}};

// Every transpose combo x broadcast mode x accumulate x shape for one dtype.
void sweep(MatmulDType dtype) {
  for (const Shape& s : kShapes)
    for (int trans = 0; trans < 4; ++trans)
      for (int acc = 0; acc < 2; ++acc) {
        // (batch, batch_a, batch_b): unbatched, full batch, A broadcast, B broadcast, both.
        const int64_t modes[][3] = {{1, 1, 1}, {3, 3, 3}, {3, 1, 3}, {3, 3, 1}, {3, 1, 1}};
        for (const auto& m : modes)
          check_case({dtype, m[0], m[1], m[2], s.M, s.N, s.K, bool(trans & 1), bool(trans & 2),
                      bool(acc)},
                     uint32_t(s.M * 131 + trans * 7 + acc));
      }
}

TEST(MatmulKernel, F32AllTransposesBroadcastAccumulate) { sweep(MatmulDType::f32); }
TEST(MatmulKernel, Bf16AllTransposesBroadcastAccumulate) { sweep(MatmulDType::bf16); }
TEST(MatmulKernel, F16AllTransposesBroadcastAccumulate) { sweep(MatmulDType::f16); }
// MatmulPrecision::bf16: f32 operands rounded to bf16 inside the kernel, f32 accumulation;
// the caller's buffers stay untouched.
TEST(MatmulKernel, F32AsBf16AllTransposesBroadcastAccumulate) { sweep(MatmulDType::f32_as_bf16); }

TEST(MatmulKernel, LargerShapesAllDtypes) {
  // Big enough for oneDNN's blocked paths and the parallel f16 conversion (> 64Ki elements).
  for (MatmulDType d : {MatmulDType::f32, MatmulDType::bf16, MatmulDType::f16, MatmulDType::f32_as_bf16}) {
    check_case({d, 1, 1, 1, 300, 260, 290, false, false, false});
    check_case({d, 2, 2, 1, 130, 190, 257, true, true, true});
    check_case({d, 2, 1, 2, 129, 70, 300, true, false, false});
  }
}

// 16-bit products on a CPU without native kernels for them are widened to f32 (f32 operands
// multiplied as bf16 are rounded into f32 staging); above the staging limit an unbatched one
// runs block by block (M, N and K split, C kept in f32 across
// its K blocks). A limit of 100 elements sends these small shapes through every blocking.
TEST(MatmulKernel, WidenedProductsInBlocksEqualTheReference) {
  const size_t previous = mt::cpu::set_matmul_staging_limit(100);
  for (MatmulDType d : {MatmulDType::bf16, MatmulDType::f16, MatmulDType::f32_as_bf16})
    for (const Shape& s : {Shape{33, 65, 17}, Shape{7, 13, 50}, Shape{64, 3, 32}, Shape{1, 300, 2}})
      for (int trans = 0; trans < 4; ++trans)
        for (int acc = 0; acc < 2; ++acc)
          check_case({d, 1, 1, 1, s.M, s.N, s.K, bool(trans & 1), bool(trans & 2), bool(acc)},
                     uint32_t(s.N * 17 + trans * 3 + acc));
  // bf16 operands, f32 output: blocked and whole agree to f32 rounding.
  std::mt19937 rng(5);
  const int64_t M = 40, N = 70, K = 90;
  Buffer a(MatmulDType::bf16, size_t(M * K), rng), b(MatmulDType::bf16, size_t(K * N), rng);
  for (bool accumulate : {false, true}) {
    std::vector<float> blocked(size_t(M * N), 0.5f), whole(size_t(M * N), 0.5f);
    mt::cpu::set_matmul_staging_limit(100);
    mt::cpu::matmul(MatmulDType::bf16_f32, a.data(), b.data(), blocked.data(), 1, 1, 1, M, N, K, false, true, accumulate);
    mt::cpu::set_matmul_staging_limit(previous);
    mt::cpu::matmul(MatmulDType::bf16_f32, a.data(), b.data(), whole.data(), 1, 1, 1, M, N, K, false, true, accumulate);
    for (size_t i = 0; i < blocked.size(); ++i) ASSERT_NEAR(blocked[i], whole[i], 1e-4) << "element " << i;
  }
  mt::cpu::set_matmul_staging_limit(previous);
}

TEST(MatmulKernel, ZeroKOverwritesWithZerosOrLeavesAccumulated) {
  for (MatmulDType d : {MatmulDType::f32, MatmulDType::bf16, MatmulDType::f16}) {
    SCOPED_TRACE(name(d));
    std::mt19937 rng(3);
    Buffer c(d, 2 * 3 * 4, rng);
    const std::vector<double> c0 = c.value;
    // a and b are never read when K == 0, so null pointers are fine.
    mt::cpu::matmul(d, nullptr, nullptr, c.data(), 2, 2, 1, 3, 4, 0, false, true, true);
    for (size_t i = 0; i < c0.size(); ++i) EXPECT_EQ(c.get(i), c0[i]);
    mt::cpu::matmul(d, nullptr, nullptr, c.data(), 2, 2, 1, 3, 4, 0, false, false, false);
    for (size_t i = 0; i < c0.size(); ++i) EXPECT_EQ(c.get(i), 0.0);
  }
}

TEST(MatmulKernel, EmptyOutputsAreNoOps) {
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4};
  float c[4] = {7, 7, 7, 7};
  mt::cpu::matmul(MatmulDType::f32, a, b, c, 0, 1, 1, 2, 2, 2, false, false);  // batch 0
  mt::cpu::matmul(MatmulDType::f32, a, b, c, 1, 1, 1, 0, 2, 2, false, false);  // M 0
  mt::cpu::matmul(MatmulDType::f32, a, b, c, 1, 1, 1, 2, 0, 2, false, false);  // N 0
  mt::cpu::matmul(MatmulDType::f32, nullptr, nullptr, nullptr, 0, 0, 0, 5, 5, 5, true, true);
  for (float v : c) EXPECT_EQ(v, 7.0f);
}

TEST(MatmulKernel, KnownSmallProduct) {
  // [[1,2,3],[4,5,6]] @ [[7,8],[9,10],[11,12]] = [[58,64],[139,154]]
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const float b[6] = {7, 8, 9, 10, 11, 12};
  float c[4] = {};
  mt::cpu::matmul(MatmulDType::f32, a, b, c, 1, 1, 1, 2, 2, 3, false, false);
  EXPECT_EQ(c[0], 58.0f);
  EXPECT_EQ(c[1], 64.0f);
  EXPECT_EQ(c[2], 139.0f);
  EXPECT_EQ(c[3], 154.0f);
  mt::cpu::matmul(MatmulDType::f32, a, b, c, 1, 1, 1, 2, 2, 3, false, false, true);
  EXPECT_EQ(c[0], 116.0f);
  EXPECT_EQ(c[3], 308.0f);
}

TEST(MatmulKernel, BadBatchThrowsWithShapes) {
  float buf[64] = {};
  try {
    mt::cpu::matmul(MatmulDType::f32, buf, buf, buf, 3, 2, 1, 2, 2, 2, false, false);
    FAIL() << "expected a throw";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[matmul]", 0), 0u) << msg;
    EXPECT_NE(msg.find("batch_a=2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("M=2"), std::string::npos) << msg;
  }
  EXPECT_THROW(mt::cpu::matmul(MatmulDType::f32, buf, buf, buf, 1, 1, 1, -1, 2, 2, false, false),
               std::runtime_error);
}

TEST(MatmulKernel, CacheReusesPrimitives) {
  // A few rows times a transposed weight run on cached oneDNN primitives (other f32 products
  // go to the jit GEMM, which needs no cache: prefers_jit_sgemm).
  mt::cpu::matmul_clear_cache();
  EXPECT_EQ(mt::cpu::matmul_cache_size(), 0u);
  std::vector<float> a(5 * 6, 1.0f), b(7 * 6, 1.0f), c(5 * 7);
  for (int i = 0; i < 3; ++i)
    mt::cpu::matmul(MatmulDType::f32, a.data(), b.data(), c.data(), 1, 1, 1, 5, 7, 6, false, true);
  EXPECT_EQ(mt::cpu::matmul_cache_size(), 1u);
  for (float v : c) EXPECT_EQ(v, 6.0f);
  // accumulate and transposes are part of the key.
  mt::cpu::matmul(MatmulDType::f32, a.data(), b.data(), c.data(), 1, 1, 1, 5, 7, 6, false, true,
                  true);
  mt::cpu::matmul(MatmulDType::f32, a.data(), b.data(), c.data(), 1, 1, 1, 5, 7, 6, true, true);
  EXPECT_EQ(mt::cpu::matmul_cache_size(), 3u);
  mt::cpu::matmul_clear_cache();
  EXPECT_EQ(mt::cpu::matmul_cache_size(), 0u);
  // Still works after clearing (thread-local slots must notice the clear).
  mt::cpu::matmul(MatmulDType::f32, a.data(), b.data(), c.data(), 1, 1, 1, 5, 7, 6, false, true);
  for (float v : c) EXPECT_EQ(v, 6.0f);
  EXPECT_EQ(mt::cpu::matmul_cache_size(), 1u);
}

TEST(MatmulKernel, CacheDropsThePlanUnusedLongestPastItsCapacity) {
  // A server meets a new product shape with every prompt length: past its capacity the cache
  // drops the plan used least recently, and threads let go of it too, so what stays alive is
  // bounded. Few rows times a transposed weight run on primitives (prefers_jit_sgemm).
  mt::cpu::matmul_clear_cache();
  const size_t previous = mt::cpu::set_matmul_cache_capacity(4);
  const int64_t N = 7, K = 6;
  std::vector<float> a(64 * K, 1.0f), b(N * K, 1.0f), c(64 * N);
  auto run = [&](int64_t M) {
    std::fill(c.begin(), c.end(), 0.0f);
    mt::cpu::matmul(MatmulDType::f32, a.data(), b.data(), c.data(), 1, 1, 1, M, N, K, false, true);
    for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(c[size_t(i)], float(K)) << "M=" << M << " at " << i;
  };
  run(2);  // this thread lets go of its plans from before the clear
  // Plans other threads may still hold (they let go at their next matmul).
  const size_t elsewhere = mt::cpu::matmul_plans_alive() - 1;
  for (int64_t M = 3; M <= 5; ++M) run(M);
  EXPECT_EQ(mt::cpu::matmul_cache_size(), 4u);
  run(2);  // used again: now M=3 is the one unused longest
  const uint64_t created = mt::cpu::matmul_plans_created();
  run(6);  // drops M=3
  EXPECT_EQ(mt::cpu::matmul_plans_created(), created + 1);
  EXPECT_EQ(mt::cpu::matmul_cache_size(), 4u);
  EXPECT_EQ(mt::cpu::matmul_plans_alive(), elsewhere + 4);  // this thread let go of M=3 as well
  run(2), run(4), run(5), run(6);
  EXPECT_EQ(mt::cpu::matmul_plans_created(), created + 1) << "a kept plan was created again";
  run(3);
  EXPECT_EQ(mt::cpu::matmul_plans_created(), created + 2) << "the dropped plan was not created again";

  // Another thread's use decides what the cache drops; this thread lets go of those plans at its
  // next miss, not only of its own least recently used one.
  mt::cpu::matmul_clear_cache();
  for (int64_t M = 2; M <= 5; ++M) run(M);
  std::thread([&] {
    std::vector<float> ct(64 * N);
    for (int64_t M : {3, 6}) mt::cpu::matmul(MatmulDType::f32, a.data(), b.data(), ct.data(), 1, 1, 1, M, N, K, false, true);
  }).join();  // M=6 dropped M=2
  run(7);     // drops M=4, the unused longest now
  EXPECT_EQ(mt::cpu::matmul_cache_size(), 4u);
  EXPECT_EQ(mt::cpu::matmul_plans_alive(), elsewhere + 4) << "this thread still holds a plan the cache dropped";

  // Threads each meeting many shapes: the cache stays at its capacity, and each thread holds
  // at most as many plans as the cache may.
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> ct(64 * N);
      for (int64_t M = 2 + t; M < 64; M += 3) {
        mt::cpu::matmul(MatmulDType::f32, a.data(), b.data(), ct.data(), 1, 1, 1, M, N, K, false, true);
        for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(ct[size_t(i)], float(K)) << "M=" << M;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mt::cpu::matmul_cache_size(), 4u);
  run(2);  // this thread lets go of what the others' shapes pushed out
  EXPECT_EQ(mt::cpu::matmul_plans_alive(), elsewhere + 4) << "the joined threads let go of theirs";
  EXPECT_THROW(mt::cpu::set_matmul_cache_capacity(0), std::runtime_error);
  mt::cpu::set_matmul_cache_capacity(previous);
  mt::cpu::matmul_clear_cache();
  run(2);
  EXPECT_EQ(mt::cpu::matmul_plans_alive(), elsewhere + 1) << "clearing let go of every plan";
}

TEST(MatmulKernel, JitGemmShapesNeedNoPrimitive) {
  // (K, N)-stored weights and long row blocks take oneDNN's jit GEMM: no primitive is built,
  // and each layout and the accumulate form give the exact integer products.
  mt::cpu::matmul_clear_cache();
  const int64_t M = 70, N = 9, K = 5;
  std::vector<float> a(size_t(M * K)), b(size_t(K * N)), c(size_t(M * N), 1.0f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 7);
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(i % 5) - 2.0f;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      for (bool accumulate : {false, true}) {
        std::fill(c.begin(), c.end(), 1.0f);
        mt::cpu::matmul(MatmulDType::f32, a.data(), b.data(), c.data(), 1, 1, 1, M, N, K, ta, tb, accumulate);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            float want = accumulate ? 1.0f : 0.0f;
            for (int64_t k = 0; k < K; ++k)
              want += a[size_t(ta ? k * M + i : i * K + k)] * b[size_t(tb ? j * K + k : k * N + j)];
            ASSERT_EQ(c[size_t(i * N + j)], want) << "ta=" << ta << " tb=" << tb << " acc=" << accumulate;
          }
      }
    }
  EXPECT_EQ(mt::cpu::matmul_cache_size(), 0u);
}

TEST(MatmulKernel, ConcurrentCallersShareTheCache) {
  // Same and different shapes from several threads at once, against the serial result.
  std::vector<std::thread> threads;
  std::vector<int> errors(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &errors] {
      const int64_t M = 16 + (t % 2) * 8, N = 24, K = 40;
      std::vector<float> a(size_t(M * K)), b(size_t(K * N)), c(size_t(M * N));
      for (size_t i = 0; i < a.size(); ++i) a[i] = float((i * 7 + t) % 5) - 2.0f;
      for (size_t i = 0; i < b.size(); ++i) b[i] = float((i * 3) % 7) - 3.0f;
      for (int rep = 0; rep < 50; ++rep) {
        mt::cpu::matmul(MatmulDType::f32, a.data(), b.data(), c.data(), 1, 1, 1, M, N, K, false,
                        false);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            float ref = 0;  // small integers: exact in f32
            for (int64_t k = 0; k < K; ++k) ref += a[size_t(i * K + k)] * b[size_t(k * N + j)];
            if (c[size_t(i * N + j)] != ref) ++errors[size_t(t)];
          }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int e : errors) EXPECT_EQ(e, 0);
}

TEST(HalfConversion, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_bits_to_float(uint16_t(h));
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
    if (is_nan) {
      EXPECT_TRUE(std::isnan(f)) << h;
      const uint16_t back = float_to_half_bits(f);
      EXPECT_TRUE((back & 0x7c00) == 0x7c00 && (back & 0x3ff)) << h;
    } else {
      ASSERT_EQ(float_to_half_bits(f), uint16_t(h)) << h;
    }
  }
}

TEST(HalfConversion, KnownValues) {
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half_bits(65519.996f), 0x7bff);  // just below the tie
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00);    // tie rounds to even = inf
  EXPECT_EQ(float_to_half_bits(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half_bits(-INFINITY), 0xfc00);
  EXPECT_EQ(float_to_half_bits(0x1p-24f), 0x0001);      // smallest subnormal
  EXPECT_EQ(float_to_half_bits(0x1p-25f), 0x0000);      // tie to even -> 0
  EXPECT_EQ(float_to_half_bits(0x1.8p-24f), 0x0002);    // 1.5 ulp tie -> 2 (even)
  EXPECT_EQ(float_to_half_bits(0x1.000002p-25f), 1);    // just above the tie
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even mantissa (1.0) wins.
  EXPECT_EQ(float_to_half_bits(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(float_to_half_bits(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(half_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_bits_to_float(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(NAN))));
}

TEST(HalfConversion, RandomFloatsRoundToNearestEven) {
  // For random finite floats in half range, the result must be at least as close as both
  // neighbours, with ties going to the even pattern.
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> exp_dist(100, 142), mant_dist(0, 0x7fffff);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = (exp_dist(rng) << 23) | mant_dist(rng);
    const float f = std::bit_cast<float>(bits);
    if (f >= 65504.0f) continue;
    const uint16_t h = float_to_half_bits(f);
    const double err = std::fabs(double(half_bits_to_float(h)) - f);
    for (int delta : {-1, 1}) {
      const int nb = int(h) + delta;
      if (nb < 0 || nb >= 0x7c00) continue;
      const double nerr = std::fabs(double(half_bits_to_float(uint16_t(nb))) - f);
      ASSERT_LE(err, nerr) << std::hexfloat << f;
      if (err == nerr) {
        ASSERT_EQ(h & 1, 0) << std::hexfloat << f;
      }
    }
  }
}

}  // namespace
