#include "meshtrain/backend/matmul.h"

#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/backend/cpu/matmul_plans.h"
#include "meshtrain/backend/cpu/own_loop.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/core/element.h"

#include <oneapi/dnnl/dnnl.h>  // dnnl_sgemm
#include <oneapi/dnnl/dnnl_debug.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

using kernels::MatmulDType;
using matmul_plans::describe;
using matmul_plans::PlanKey;

namespace {

size_t out_elem_size(MatmulDType dtype) {
  return dtype == MatmulDType::bf16 || dtype == MatmulDType::f16 ? 2 : 4;
}

// Staging buffers for the widened (non-native) and rounded paths, kept per thread to avoid
// page faults on every call (up to kKeptStagingBytes each, see ReleaseLargeStaging).
struct Staging {
  std::vector<float> a32, b32, c32;
  std::vector<uint16_t> a16, b16;
};

// Staging larger than this is released when its call ends. Kept, the largest product's widened
// operands (GPT-2's 50257-row LM head: 257 MB for GPT-2 Large) stayed resident for the whole
// run on top of the arrays' own peak (bf16 on an AVX2 CPU peaked 0.4 GB above f32); faulting
// them in again costs about 1 % of such a product.
constexpr size_t kKeptStagingBytes = size_t(64) << 20;

struct ReleaseLargeStaging {
  Staging& tc;
  template <class T>
  static void release_if_large(std::vector<T>& v) {
    if (v.capacity() * sizeof(T) > kKeptStagingBytes) std::vector<T>().swap(v);
  }
  ~ReleaseLargeStaging() {
    release_if_large(tc.a32), release_if_large(tc.b32), release_if_large(tc.c32);
    release_if_large(tc.a16), release_if_large(tc.b16);
  }
};

Staging& thread_staging() {
  thread_local Staging staging;
  return staging;
}

// oneDNN 2.6's matmul primitive picks its brgemm kernels on AVX-512, which run some of the
// most common training shapes at a third of the machine's f32 peak: a row-major B with
// N = 3072 (BERT's and GPT-2's FFN gradients: 125-160 GFLOP/s against 340 with the jit
// GEMM on a 2-core AMX Xeon), the (50257 × 768) LM-head weight gradient (217 vs 349). Its
// classic jit GEMM (dnnl_sgemm, what the primitive itself picks on AVX2) is as fast or
// faster everywhere measured except a few-row activation times a transposed weight (decode
// steps: 4-63 rows, e.g. 16 × 768 × 768: 157 vs 126), which stays on the primitive.
// Measured per shape by bench/matmul_bench.
bool prefers_jit_sgemm(int64_t M, bool trans_b) { return !trans_b || M == 1 || M >= 64; }

// C = op(A) · op(B) (+ C) in f32, row-major, through oneDNN's jit GEMM.
void run_sgemm(const float* a, const float* b, float* c, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b,
               bool accumulate) {
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, 1.0f, a, trans_a ? M : K, b,
                                      trans_b ? K : N, accumulate ? 1.0f : 0.0f, c, N);
  if (st != dnnl_success)
    throw Error(detail::concat("[matmul] oneDNN sgemm failed (", dnnl_status2str(st), ") for M=", M, " N=", N,
                               " K=", K, " trans_a=", trans_a, " trans_b=", trans_b));
}

// Runs the matmul on oneDNN in the given (natively supported) dtype. K > 0, all sizes > 0.
// jit_gemm_allowed = false keeps f32 on the primitive too (matmul_in_kernel).
void run_onednn(MatmulDType dtype, const void* a, const void* b, void* c, int64_t batch,
                int64_t batch_a, int64_t batch_b, int64_t M, int64_t N, int64_t K, bool trans_a,
                bool trans_b, bool accumulate, bool jit_gemm_allowed = true) {
  // oneDNN needs dst batch == max(src batch, weights batch); when both operands broadcast
  // every output slice is the same product, so run a batch-1 primitive.
  const bool both_broadcast = batch > 1 && batch_a == 1 && batch_b == 1;
  const bool jit_gemm = jit_gemm_allowed && dtype == MatmulDType::f32 && (batch == 1 || both_broadcast) &&
                        prefers_jit_sgemm(M, trans_b);
  const PlanKey key{dtype, both_broadcast ? 1 : batch, batch_a, batch_b, M, N, K,
                    trans_a, trans_b, accumulate};
  if (jit_gemm) matmul_plans::init_onednn();  // applies the instruction-set cap first
  // One product into `out`: the whole batch on a primitive, one matrix on the jit GEMM.
  auto product = [&](void* out) {
    if (jit_gemm)
      run_sgemm(static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(out), M, N, K,
                trans_a, trans_b, accumulate);
    else
      matmul_plans::run(key, a, b, out);
  };
  if (!both_broadcast) {
    product(c);
    return;
  }
  const size_t slice = size_t(M) * size_t(N) * out_elem_size(dtype);
  auto* c_bytes = static_cast<std::byte*>(c);
  if (accumulate) {
    // Each slice holds different data to add onto, so each needs its own product.
    for (int64_t i = 0; i < batch; ++i) product(c_bytes + size_t(i) * slice);
  } else {
    product(c_bytes);
    for (int64_t i = 1; i < batch; ++i) std::memcpy(c_bytes + size_t(i) * slice, c_bytes, slice);
  }
}

// fn(begin, count) over [0, n) in chunks of 64Ki elements, on the OpenMP threads when there
// is more than one chunk.
template <class Fn>
void for_chunks(int64_t n, Fn&& fn) {
  const int64_t chunk = grain::copy;
#pragma omp parallel for schedule(static) if (n > chunk)
  for (int64_t begin = 0; begin < n; begin += chunk) fn(begin, std::min(chunk, n - begin));
}

// n elements of x from element `at`, as the f32 values the product sees: bf16 or f16 widened
// (exact), or (in = f32_as_bf16) f32 rounded to bf16.
void widen_n(MatmulDType in, const void* x, int64_t at, float* d, int64_t n) {
  if (in == MatmulDType::f32_as_bf16) return f32_round_to_bf16_n(static_cast<const float*>(x) + at, d, n);
  const uint16_t* s = static_cast<const uint16_t*>(x) + at;
  if (in != MatmulDType::f16) return bf16_to_f32_n(s, d, n);
  f16_to_f32_n(s, d, n);
}

// The first n elements of src widened (widen_n) into dst, grown to fit.
void widen(MatmulDType in, const void* src, std::vector<float>& dst, size_t n) {
  if (dst.size() < n) dst.resize(n);
  float* d = dst.data();
  for_chunks(int64_t(n), [&](int64_t begin, int64_t count) { widen_n(in, src, begin, d + begin, count); });
}

// f32 back to 16-bit floats, rounding to nearest even.
void narrow(MatmulDType dtype, const float* src, void* dst, size_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for_chunks(int64_t(n), [&](int64_t begin, int64_t count) {
    if (dtype != MatmulDType::f16) return f32_to_bf16_n(src + begin, d + begin, count);
    f32_to_f16_n(src + begin, d + begin, count);
  });
}

// Products per element read or written below which a bf16 GEMM stays on oneDNN's bf16
// kernel even where cpu_features chose to widen (a slow bf16 dot product): such a product is
// bound by memory, not by the dot product, and widening (2 bytes read, 4 written and read
// again per element) would cost more than it saves. Calibrated with matmul_bench's route
// table on an Intel Xeon whose dot product runs at 0.48x the FMA's rate: widened against
// native, (8, 768, 768) (8 products per element) 0.46x, (32, 768, 768) (30) 1.02x,
// (64, 768, 768) (55) 1.25x, (64, 50257, 768) (59) 1.38x, (1024, 768, 768) 1.7x.
constexpr double kWidenFromProductsPerElement = 32;

bool bf16_runs_natively(int64_t M, int64_t N, int64_t K) {
  const CpuFeatures& f = cpu_features();
  if (f.bf16_gemm_native) return true;
  if (!f.bf16_gemm_onednn || !f.bf16_gemm_forced.empty()) return false;
  const double products = double(M) * double(N) * double(K);
  const double elements = double(M) * double(K) + double(K) * double(N) + double(M) * double(N);
  return products < kWidenFromProductsPerElement * elements;
}

bool runs_natively(MatmulDType dtype, int64_t M, int64_t N, int64_t K) {
  switch (dtype) {
    case MatmulDType::f32:
    case MatmulDType::f32_as_tf32:
    case MatmulDType::f32_as_bf16: return true;
    case MatmulDType::f16: return cpu_features().f16_gemm_native;
    case MatmulDType::bf16:
    case MatmulDType::bf16_f32: return bf16_runs_natively(M, N, K);
  }
  return false;
}

// Rows [r0, r0 + rows) x columns [c0, c0 + cols) of a row-major matrix whose rows hold `ld`
// elements, widened (widen_n) into a dense (rows, cols) block. Contiguous reads whatever the
// operand's transpose flag: the block keeps the stored layout, and the flag carries over.
void widen_block(MatmulDType in, const void* x, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                 float* dst) {
#pragma omp parallel for schedule(static) if (rows * cols > grain::copy)
  for (int64_t r = 0; r < rows; ++r) widen_n(in, x, (r0 + r) * ld + c0, dst + r * cols, cols);
}

// The largest operand block (elements) the widened path stages at once (set_matmul_staging_limit).
std::atomic<size_t> staging_limit{size_t(4) << 20};  // 16 MB of f32

// Block sizes (bm, bn, bk) whose widened A, B and C blocks each hold at most `limit` elements:
// the largest of the three halved along its larger side until all fit.
std::array<int64_t, 3> widened_blocks(int64_t M, int64_t N, int64_t K, size_t limit) {
  int64_t bm = M, bn = N, bk = K;
  auto half = [](int64_t& d) { d = (d + 1) / 2; };
  for (;;) {
    const size_t am = size_t(bm) * size_t(bk), bb = size_t(bk) * size_t(bn), cm = size_t(bm) * size_t(bn);
    if (std::max({am, bb, cm}) <= limit) return {bm, bn, bk};
    if (am >= bb && am >= cm) half(bm >= bk ? bm : bk);
    else if (bb >= cm) half(bk >= bn ? bk : bn);
    else half(bm >= bn ? bm : bn);
  }
}

// run_widened for one unbatched product too large to widen whole: block by block, each block
// of C kept in f32 across its K blocks and rounded back once, so what is resident stays
// bounded (GPT-2 Large's LM head widened whole is 257 MB beside the arrays' peak).
void run_widened_blocked(MatmulDType dtype, MatmulDType in, const void* a, const void* b, void* c, int64_t M, int64_t N,
                         int64_t K, bool trans_a, bool trans_b, bool accumulate, std::array<int64_t, 3> blocks) {
  const auto [bm, bn, bk] = blocks;
  auto& tc = thread_staging();
  const bool f32_out = dtype == MatmulDType::bf16_f32 || dtype == MatmulDType::f32_as_bf16;
  if (tc.a32.size() < size_t(bm * bk)) tc.a32.resize(size_t(bm * bk));
  if (tc.b32.size() < size_t(bk * bn)) tc.b32.resize(size_t(bk * bn));
  if (tc.c32.size() < size_t(bm * bn)) tc.c32.resize(size_t(bm * bn));
  for (int64_t m0 = 0; m0 < M; m0 += bm) {
    const int64_t rm = std::min(bm, M - m0);
    for (int64_t n0 = 0; n0 < N; n0 += bn) {
      const int64_t rn = std::min(bn, N - n0);
      float* cb = tc.c32.data();
      if (accumulate) {
        if (f32_out)
          for (int64_t i = 0; i < rm; ++i)
            std::memcpy(cb + i * rn, static_cast<const float*>(c) + (m0 + i) * N + n0, size_t(rn) * sizeof(float));
        else widen_block(in, c, N, m0, rm, n0, rn, cb);
      }
      for (int64_t k0 = 0; k0 < K; k0 += bk) {
        const int64_t rk = std::min(bk, K - k0);
        // A stored (M, K), or (K, M) when trans_a; B stored (K, N), or (N, K) when trans_b.
        if (trans_a) widen_block(in, a, M, k0, rk, m0, rm, tc.a32.data());
        else widen_block(in, a, K, m0, rm, k0, rk, tc.a32.data());
        if (trans_b) widen_block(in, b, K, n0, rn, k0, rk, tc.b32.data());
        else widen_block(in, b, N, k0, rk, n0, rn, tc.b32.data());
        run_onednn(MatmulDType::f32, tc.a32.data(), tc.b32.data(), cb, 1, 1, 1, rm, rn, rk, trans_a, trans_b,
                   accumulate || k0 > 0);
      }
      for (int64_t i = 0; i < rm; ++i) {
        if (f32_out) std::memcpy(static_cast<float*>(c) + (m0 + i) * N + n0, cb + i * rn, size_t(rn) * sizeof(float));
        else narrow(in, cb + i * rn, static_cast<uint16_t*>(c) + (m0 + i) * N + n0, size_t(rn));
      }
    }
  }
}

// Whether an unbatched product too large to stage whole ran in blocks (run_widened_blocked);
// false leaves it to the caller, which stages its operands whole.
bool ran_in_blocks(MatmulDType dtype, MatmulDType in, const void* a, const void* b, void* c, int64_t batch, int64_t M,
                   int64_t N, int64_t K, bool trans_a, bool trans_b, bool accumulate) {
  if (batch != 1) return false;
  const std::array<int64_t, 3> blocks = widened_blocks(M, N, K, staging_limit.load());
  if (blocks == std::array<int64_t, 3>{M, N, K}) return false;
  run_widened_blocked(dtype, in, a, b, c, M, N, K, trans_a, trans_b, accumulate, blocks);
  return true;
}

// A 16-bit matmul oneDNN cannot run here: widen the operands to f32 (layouts unchanged, so
// the trans flags carry over), multiply in f32, round the result back once (bf16_f32 keeps
// it f32). Products of bf16 or f16 values are exact in f32, so this differs from a native
// kernel only in the order of the f32 sums. An unbatched product whose operands exceed the
// staging limit runs in blocks.
void run_widened(MatmulDType dtype, const void* a, const void* b, void* c, int64_t batch, int64_t batch_a,
                 int64_t batch_b, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, bool accumulate) {
  const MatmulDType in = dtype == MatmulDType::bf16_f32 ? MatmulDType::bf16 : dtype;
  auto& tc = thread_staging();
  ReleaseLargeStaging release{tc};
  if (ran_in_blocks(dtype, in, a, b, c, batch, M, N, K, trans_a, trans_b, accumulate)) return;
  const size_t na = size_t(batch_a) * size_t(M) * size_t(K);
  const size_t nb = size_t(batch_b) * size_t(K) * size_t(N);
  const size_t nc = size_t(batch) * size_t(M) * size_t(N);
  widen(in, a, tc.a32, na);
  widen(in, b, tc.b32, nb);
  if (dtype == MatmulDType::bf16_f32) {
    run_onednn(MatmulDType::f32, tc.a32.data(), tc.b32.data(), c, batch, batch_a, batch_b, M, N, K, trans_a, trans_b,
               accumulate);
    return;
  }
  if (tc.c32.size() < nc) tc.c32.resize(nc);
  if (accumulate) widen(in, c, tc.c32, nc);
  run_onednn(MatmulDType::f32, tc.a32.data(), tc.b32.data(), tc.c32.data(), batch, batch_a, batch_b, M, N, K, trans_a,
             trans_b, accumulate);
  narrow(in, tc.c32.data(), c, nc);
}

// f32 operands multiplied as bf16: rounded into staging buffers (bf16 where oneDNN has a bf16
// kernel, else f32 holding the bf16 values, which skips a widening pass) and multiplied
// with f32 accumulation into the f32 output.
void run_as_bf16(const float* a, const float* b, void* c, int64_t batch, int64_t batch_a, int64_t batch_b, int64_t M,
                 int64_t N, int64_t K, bool trans_a, bool trans_b, bool accumulate) {
  auto& tc = thread_staging();
  ReleaseLargeStaging release{tc};
  const size_t na = size_t(batch_a * M * K), nb = size_t(batch_b * K * N);
  if (bf16_runs_natively(M, N, K)) {
    if (tc.a16.size() < na) tc.a16.resize(na);
    if (tc.b16.size() < nb) tc.b16.resize(nb);
    for_chunks(int64_t(na), [&](int64_t i, int64_t count) { f32_to_bf16_n(a + i, tc.a16.data() + i, count); });
    for_chunks(int64_t(nb), [&](int64_t i, int64_t count) { f32_to_bf16_n(b + i, tc.b16.data() + i, count); });
    run_onednn(MatmulDType::bf16_f32, tc.a16.data(), tc.b16.data(), c, batch, batch_a, batch_b, M, N, K, trans_a, trans_b,
               accumulate);
    return;
  }
  constexpr MatmulDType rounded = MatmulDType::f32_as_bf16;
  if (ran_in_blocks(rounded, rounded, a, b, c, batch, M, N, K, trans_a, trans_b, accumulate)) return;
  widen(rounded, a, tc.a32, na);
  widen(rounded, b, tc.b32, nb);
  run_onednn(MatmulDType::f32, tc.a32.data(), tc.b32.data(), c, batch, batch_a, batch_b, M, N, K, trans_a, trans_b,
             accumulate);
}

}  // namespace

size_t set_matmul_staging_limit(size_t elements) {
  MT_CHECK(elements > 0, "[matmul] the staging limit must be positive");
  return staging_limit.exchange(elements);
}

size_t matmul_cache_size() { return matmul_plans::cached(); }
size_t matmul_plans_alive() { return matmul_plans::alive(); }
uint64_t matmul_plans_created() { return matmul_plans::created(); }
void matmul_clear_cache() { matmul_plans::clear(); }
size_t set_matmul_cache_capacity(size_t plans) { return matmul_plans::set_capacity(plans); }

namespace {
// matmul's checks and dispatch; jit_gemm_allowed = false keeps f32 off dnnl_sgemm
// (matmul_in_kernel).
void checked_matmul(MatmulDType dtype,
                    const void* a,  // (batch_a, M, K), or (batch_a, K, M) when trans_a
                    const void* b,  // (batch_b, K, N), or (batch_b, N, K) when trans_b
                    void* c,        // (batch, M, N)
                    int64_t batch, int64_t batch_a, int64_t batch_b, int64_t M, int64_t N, int64_t K,
                    bool trans_a, bool trans_b, bool accumulate, bool jit_gemm_allowed) {
  if (dtype == MatmulDType::f32_as_tf32) dtype = MatmulDType::f32;  // no TF32 unit on a CPU
  const PlanKey requested{dtype, batch, batch_a, batch_b, M, N, K, trans_a, trans_b, accumulate};
  MT_CHECK(dtype == MatmulDType::f32 || dtype == MatmulDType::bf16 || dtype == MatmulDType::f16 ||
               dtype == MatmulDType::bf16_f32 || dtype == MatmulDType::f32_as_bf16,
           "[matmul] invalid dtype ", int(dtype));
  MT_CHECK(batch >= 0 && M >= 0 && N >= 0 && K >= 0, "[matmul] negative size: ",
           describe(requested));
  MT_CHECK((batch_a == 1 || batch_a == batch) && (batch_b == 1 || batch_b == batch),
           "[matmul] batch_a and batch_b must each be 1 or batch: ", describe(requested));
  if (batch == 0 || M == 0 || N == 0) return;
  MT_CHECK(c != nullptr, "[matmul] null output pointer: ", describe(requested));
  if (K == 0) {
    // An empty sum is zero: overwrite with zeros, or leave c unchanged when accumulating.
    if (!accumulate) std::memset(c, 0, size_t(batch) * size_t(M) * size_t(N) * out_elem_size(dtype));
    return;
  }
  MT_CHECK(a != nullptr && b != nullptr, "[matmul] null input pointer: ", describe(requested));

  if (dtype == MatmulDType::f32_as_bf16)
    run_as_bf16(static_cast<const float*>(a), static_cast<const float*>(b), c, batch, batch_a, batch_b, M, N, K, trans_a,
                trans_b, accumulate);
  else if (runs_natively(dtype, M, N, K))
    run_onednn(dtype, a, b, c, batch, batch_a, batch_b, M, N, K, trans_a, trans_b, accumulate, jit_gemm_allowed);
  else
    run_widened(dtype, a, b, c, batch, batch_a, batch_b, M, N, K, trans_a, trans_b, accumulate);
}
}  // namespace

void matmul(MatmulDType dtype, const void* a, const void* b, void* c, int64_t batch, int64_t batch_a, int64_t batch_b,
            int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, bool accumulate) {
  checked_matmul(dtype, a, b, c, batch, batch_a, batch_b, M, N, K, trans_a, trans_b, accumulate, true);
}

void matmul_in_kernel(MatmulDType dtype, const void* a, const void* b, void* c, int64_t M, int64_t N, int64_t K,
                      bool trans_a, bool trans_b, bool accumulate) {
  checked_matmul(dtype, a, b, c, 1, 1, 1, M, N, K, trans_a, trans_b, accumulate, false);
}

void matmul_bias(MatmulDType dtype, const void* a, const void* b, const void* bias, void* c, int64_t M, int64_t N,
                 int64_t K, bool trans_a, bool trans_b) {
  matmul(dtype, a, b, c, 1, 1, 1, M, N, K, trans_a, trans_b, false);
  if (M == 0 || N == 0) return;
  MT_CHECK(bias != nullptr, "[matmul] null bias pointer for M=", M, " N=", N, " K=", K);
  // Row by row while the row is in cache, the sum rounded to c's dtype as add() rounds it.
  auto add_rows = [&](auto type) {
    using T = decltype(type);
    const T* bv = static_cast<const T*>(bias);
    T* cv = static_cast<T*>(c);
#pragma omp parallel for schedule(static) if (M * N > grain::compute)
    for (int64_t i = 0; i < M; ++i) {
      T* row = cv + i * N;
      as_own_loop([&] {
        for (int64_t j = 0; j < N; ++j) row[j] = store_f32<T>(load_f32(row[j]) + load_f32(bv[j]));
      });
    }
  };
  if (dtype == MatmulDType::bf16) add_rows(bf16{});
  else if (dtype == MatmulDType::f16) add_rows(f16{});
  else add_rows(float{});
}

}  // namespace mt::cpu
