// Every registered primitive on the GPU against its CPU kernel, on the cases of the
// registry-driven harness (tests/support/primitive_cases): forward and every floating input's
// VJP with the same cotangent. f32 within 1e-5 (relative, and 1e-5 of the largest magnitude
// for sums that cancel); integer, index and mask results exact; bf16 within the CPU tests'
// bf16 tolerance. A registered primitive that never ran on the GPU fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "meshtrain/backend/attention.h"
#include "meshtrain/backend/matmul.h"
#include "meshtrain/ops/fused_ops.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/ops/linear.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/nn_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"
#include "tests/support/gpu.h"
#include "tests/support/primitive_cases.h"
#include "tests/support/scoped_env.h"

namespace mt::testing {
namespace {

std::vector<Array> on(const std::vector<Array>& xs, Device d) {
  std::vector<Array> out;
  for (const Array& x : xs) out.push_back(x.defined() ? x.to(d) : x);
  return out;
}

// fn's output and input cotangents for `cot`, computed on the GPU (inputs and cotangent moved
// there).
std::pair<Array, std::vector<Array>> vjp_on_gpu(const OpFn& fn, const std::vector<Array>& in, const Array& cot) {
  const Device gpu = Device::cuda(0);
  DeviceScope scope(gpu);
  return vjp(fn, on(in, gpu), cot.to(gpu));
}

Tolerance gpu_tolerance(DType dtype, const Tolerance& case_tol) {
  Tolerance t = dtype == DType::f32 ? Tolerance{1e-5, 1e-5, 1e-5} : default_tolerance(dtype);
  t.atol = std::max(t.atol, case_tol.atol);
  t.rtol = std::max(t.rtol, case_tol.rtol);
  t.scaled_atol = std::max(t.scaled_atol, case_tol.scaled_atol);
  return t;
}

// One case on `in` (its inputs, or their bf16 variant) on the GPU against the CPU: forward and
// every floating input's VJP with the same cotangent. `tolerance_dtype`: the tolerance of that
// dtype for every comparison (bf16 variants), else each result's own.
void expect_case_gpu_equals_cpu(const PrimitiveCase& c, const std::vector<Array>& in, const std::string& label,
                                std::optional<DType> tolerance_dtype = std::nullopt) {
  const Device gpu = Device::cuda(0);
  auto tolerance = [&](DType d) { return gpu_tolerance(tolerance_dtype.value_or(d), c.tol); };
  const Array ref = c.fn(in);
  Array ours;
  {
    DeviceScope scope(gpu);
    ours = c.fn(on(in, gpu));
  }
  ASSERT_TRUE(ours.device() == gpu) << label << " returned an array on " << ours.device().str();
  expect_close(ours.to(Device::cpu()), ref, tolerance(ref.dtype()), label + " forward, gpu vs cpu");
  if (!c.grads || !is_floating(ref.dtype())) return;
  const Array cot = random_normal(ref.shape(), 4242, ref.dtype());
  const auto cpu_grads = vjp(c.fn, in, cot).second;
  const std::vector<Array> gpu_grads = vjp_on_gpu(c.fn, in, cot).second;
  ASSERT_EQ(cpu_grads.size(), gpu_grads.size());
  for (size_t i = 0; i < cpu_grads.size(); ++i) {
    if (!cpu_grads[i].defined()) continue;
    ASSERT_TRUE(gpu_grads[i].defined()) << label << " input " << i << ": no gradient on the GPU";
    expect_close(gpu_grads[i].to(Device::cpu()), cpu_grads[i], tolerance(cpu_grads[i].dtype()),
                 label + " vjp of input " + std::to_string(i) + ", gpu vs cpu");
  }
}

TEST(GpuPrimitives, EveryRegisteredPrimitiveEqualsTheCpuKernel) {
  MT_REQUIRE_GPU();
  std::cout << "  GPU: " << cuda_runtime().describe(0) << "\n";
  std::set<std::string> ran_on_gpu;
  prim::OpObserver previous = prim::set_op_observer([&](const prim::OpEvent& e) {
    if (e.output.defined() && e.output.device().is_cuda()) ran_on_gpu.insert(e.primitive.name());
  });
  for (const PrimitiveCase& c : primitive_cases()) {
    SCOPED_TRACE(c.primitive);
    expect_case_gpu_equals_cpu(c, c.inputs, c.primitive);
  }
  prim::set_op_observer(previous);
  int covered = 0;
  for (const auto& p : prim::registered_primitives()) {
    const bool distributed_only =
        std::any_of(distributed_only_primitives().begin(), distributed_only_primitives().end(),
                    [&](const DistributedOnly& d) { return d.primitive == p.name; });
    if (distributed_only) continue;
    EXPECT_TRUE(ran_on_gpu.count(p.name)) << "registered primitive '" << p.family << "/" << p.name
                                          << "' never ran on the GPU in this harness";
    covered += ran_on_gpu.count(p.name) ? 1 : 0;
  }
  std::cout << "  " << covered << " primitives ran on the GPU and equal the CPU kernels\n";
}

// Every case's bf16 variant (its f32 inputs in bf16, as mixed precision runs every primitive)
// on the GPU against the CPU, forward and VJPs, within bf16's tolerance.
TEST(GpuPrimitives, EveryPrimitiveInBf16EqualsTheCpuKernel) {
  MT_REQUIRE_GPU();
  int variants = 0;
  for (const PrimitiveCase& c : primitive_cases()) {
    const std::optional<std::vector<Array>> bf16 = bf16_inputs(c);
    if (!bf16 || f32_only_primitive(c.primitive)) continue;
    SCOPED_TRACE(c.primitive + " [bf16]");
    expect_case_gpu_equals_cpu(c, *bf16, c.primitive + " [bf16]", DType::bf16);
    ++variants;
  }
  std::cout << "  " << variants << " bf16 cases on the GPU equal the CPU kernels\n";
}

// Every case's f16 variant (--precision f16) on the GPU against the CPU's f16 kernels, within
// f16's tolerance; a primitive the GPU does not run in f16 must refuse with an error naming
// it (listed), never answer wrongly.
TEST(GpuPrimitives, EveryPrimitiveInF16EqualsTheCpuKernelOrRefuses) {
  MT_REQUIRE_GPU();
  int variants = 0;
  std::vector<std::string> refused;
  for (const PrimitiveCase& c : primitive_cases()) {
    if (f32_only_primitive(c.primitive)) continue;
    std::vector<Array> f16 = c.inputs;
    bool any = false;
    for (Array& x : f16)
      if (x.defined() && x.dtype() == DType::f32) x = cast(x, DType::f16), any = true;
    if (!any) continue;
    SCOPED_TRACE(c.primitive + " [f16]");
    try {
      expect_case_gpu_equals_cpu(c, f16, c.primitive + " [f16]", DType::f16);
      ++variants;
    } catch (const Error& e) {
      // Only a refusal of the dtype counts as one (its message names the primitive and the
      // dtypes it runs: "... f32 or bf16 ..."); any other error — a cuBLASLt status, the CPU
      // reference failing — is a failure, not a refusal.
      const std::string what = e.what();
      const bool dtype_refusal = what.find("[" + c.primitive) != std::string::npos &&
                                 what.find("f32 or bf16") != std::string::npos;
      EXPECT_TRUE(dtype_refusal) << c.primitive << " [f16] failed instead of running or refusing f16: " << what;
      if (dtype_refusal) refused.push_back(c.primitive + ": " + what);
    }
  }
  std::cout << "  " << variants << " f16 cases on the GPU equal the CPU kernels; " << refused.size() << " refused\n";
  for (const std::string& r : refused) std::cout << "    refused " << r << "\n";
  EXPECT_GE(variants, 60) << "most primitives run f16 on the GPU (83 cases do on the CPU)";
  EXPECT_LE(refused.size(), 4u) << "only attention's tensor-core-only layouts refuse f16";
}

// The fused and multi-pass kernels alone (the fused family, the loss, the norms and softmaxes,
// the multi-tensor AdamW), f32 and bf16: a run short enough for compute-sanitizer's racecheck
// (gpu_run.sh test), which is too slow for the whole harness. Their shared-memory reductions
// are where a missing barrier would hide.
TEST(GpuPrimitives, FusedKernelsEqualTheCpuKernel) {
  MT_REQUIRE_GPU();
  const std::set<std::string> fused = {"bias_activation", "add_dropout",    "add_dropout_layer_norm",
                                       "add_dropout_rms_norm", "cross_entropy", "softmax",
                                       "log_softmax",     "causal_softmax", "layer_norm",
                                       "rms_norm",        "adam_moments_multi", "adam_direction_multi",
                                       "sum_squares_multi", "scale_multi", "add_multi", "cast_multi", "rotary_embedding"};
  std::set<std::string> seen;
  for (const PrimitiveCase& c : primitive_cases()) {
    if (!fused.count(c.primitive)) continue;
    SCOPED_TRACE(c.primitive);
    expect_case_gpu_equals_cpu(c, c.inputs, c.primitive);
    const std::optional<std::vector<Array>> bf16 = bf16_inputs(c);
    if (bf16 && !f32_only_primitive(c.primitive)) expect_case_gpu_equals_cpu(c, *bf16, c.primitive + " [bf16]", DType::bf16);
    seen.insert(c.primitive);
  }
  EXPECT_EQ(seen, fused) << "a fused primitive has no case in the harness";
}

TEST(GpuPrimitives, MixedDevicesAreAnErrorAndHostReadsCopy) {
  MT_REQUIRE_GPU();
  const Array a = Array::from_vector(std::vector<float>{1, 2, 3}, {3});
  const Array b = a.to(Device::cuda(0));
  EXPECT_TRUE(b.device().is_cuda());
  EXPECT_EQ(b.to_floats(), (std::vector<float>{1, 2, 3}));
  expect_error([&] { add(a, b); }, {"[add]", "different devices", "cpu", "cuda:0"});
  const Array c = add(b, b);
  EXPECT_TRUE(c.device().is_cuda());
  EXPECT_EQ(c.to_floats(), (std::vector<float>{2, 4, 6}));
  EXPECT_EQ(c.to(Device::cpu()).device(), Device::cpu());
}

// The fused rotation on the GPU equals the GPU's composed ops bit for bit (the same tables,
// each product and sum rounded as they round it: no FMA), forward and gradient, in LLaMA's
// heads-inner layout with per-row positions, f32 and bf16, half-split and interleaved pairs.
TEST(GpuPrimitives, RotaryEmbeddingEqualsTheComposedOpsBitForBit) {
  MT_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  DeviceScope on(gpu);
  const bool previous = fused_layers();
  std::vector<int64_t> positions(2 * 257);
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = int64_t(i % 257) + (i < 257 ? 0 : 31);
  const Array pos = Array::from_vector(positions, {2, 257}).to(gpu);
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool interleaved : {false, true}) {
      const std::vector<Array> in = {cast(random_normal({2, 257, 6, 128}, 31), dtype).to(gpu)};
      const Array cot = cast(random_normal({2, 257, 6, 128}, 32), dtype).to(gpu);
      auto with = [&](bool fused) {
        return [&, fused](const std::vector<Array>& x) {
          set_fused_layers(fused);
          Array y = rotary_embedding(x[0], pos, 500000.0, interleaved, true);
          set_fused_layers(previous);
          return y;
        };
      };
      const std::string label = std::string("rotary ") + dtype_name(dtype) + (interleaved ? " interleaved" : " half");
      const auto [fused, fused_grads] = vjp(with(true), in, cot);
      const auto [composed, composed_grads] = vjp(with(false), in, cot);
      const double forward = max_abs_diff(fused.to(Device::cpu()), composed.to(Device::cpu()));
      const double gradient = max_abs_diff(fused_grads[0].to(Device::cpu()), composed_grads[0].to(Device::cpu()));
      std::cout << "  [max err] " << label << " fused vs composed on the GPU: forward " << forward << ", gradient "
                << gradient << "\n";
      EXPECT_EQ(forward, 0.0) << label;
      EXPECT_EQ(gradient, 0.0) << label;
    }
}

// Layer and RMS norm at both team sizes: a warp per row up to 2048 wide (a row count that
// leaves the last block's warps partly idle), a block per row beyond; forward and gradients.
TEST(GpuPrimitives, NormsOnWarpAndBlockRowsEqualTheCpu) {
  MT_REQUIRE_GPU();
  for (int64_t c : {768, 2048, 4100}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const std::vector<Array> in = {cast(random_normal({4099, c}, 51), dtype), random_normal({c}, 52),
                                     random_normal({c}, 53)};
      const Array cot = cast(random_normal({4099, c}, 54), dtype);
      const Tolerance tol = dtype == DType::f32 ? Tolerance{2e-5, 2e-5, 2e-5} : default_tolerance(dtype);
      const std::string width = std::string(dtype_name(dtype)) + " (4099, " + std::to_string(c) + ")";
      const OpFn ln = [](const std::vector<Array>& x) { return layer_norm(x[0], x[1], x[2]); };
      const OpFn rms = [](const std::vector<Array>& x) { return rms_norm(x[0], x[1]); };
      for (const auto& [name, fn] : {std::pair{"layer_norm ", ln}, std::pair{"rms_norm ", rms}}) {
        const auto [ref, ref_grads] = vjp(fn, in, cot);
        const auto [out, grads] = vjp_on_gpu(fn, in, cot);
        expect_close(out.to(Device::cpu()), ref, tol, name + width + " forward, gpu vs cpu");
        for (size_t i = 0; i < grads.size(); ++i)
          if (grads[i].defined())
            expect_close(grads[i].to(Device::cpu()), ref_grads[i], tol,
                         name + width + " gradient " + std::to_string(i) + ", gpu vs cpu");
      }
    }
  }
}

// The embedding's gradient (scatter_add) sums each row's updates in index order, as the CPU
// does: equal bit for bit, and the same on a second run, with ids repeated thousands of times
// (BERT's padding id, GPT-2's common tokens) and rows never hit.
// The residual norms x + dropout(branch) -> norm on both row teams: rows a multiple of 4 long
// draw one Philox block per 4 elements (768, 4100), others one per element (770); the masks
// must be the CPU's for the results to agree.
TEST(GpuPrimitives, ResidualNormsOnWarpAndBlockRowsEqualTheCpu) {
  MT_REQUIRE_GPU();
  const RngKey key{9, 4};
  for (int64_t c : {768, 770, 4100}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const std::vector<Array> in = {cast(random_normal({1025, c}, 61), dtype), cast(random_normal({1025, c}, 62), dtype),
                                     random_normal({c}, 63), random_normal({c}, 64)};
      const Array cot = cast(random_normal({1025, c}, 65), dtype);
      const Tolerance tol = dtype == DType::f32 ? Tolerance{2e-5, 2e-5, 2e-5} : default_tolerance(dtype);
      const std::string width = std::string(dtype_name(dtype)) + " (1025, " + std::to_string(c) + ")";
      const OpFn ln = [&](const std::vector<Array>& x) {
        return add_dropout_layer_norm(x[0], x[1], x[2], x[3], 1e-5, 0.1, key, true);
      };
      const OpFn rms = [&](const std::vector<Array>& x) {
        return add_dropout_rms_norm(x[0], x[1], x[2], 1e-6, 0.1, key, true);
      };
      for (const auto& [name, fn] : {std::pair{"add_dropout_layer_norm ", ln}, std::pair{"add_dropout_rms_norm ", rms}}) {
        const auto [ref, ref_grads] = vjp(fn, in, cot);
        const auto [out, grads] = vjp_on_gpu(fn, in, cot);
        expect_close(out.to(Device::cpu()), ref, tol, name + width + " forward, gpu vs cpu");
        for (size_t i = 0; i < grads.size(); ++i) {
          if (grads[i].defined())
            expect_close(grads[i].to(Device::cpu()), ref_grads[i], tol,
                         name + width + " gradient " + std::to_string(i) + ", gpu vs cpu");
        }
      }
    }
  }
}

TEST(GpuPrimitives, EmbeddingGradientIsDeterministicAndEqualsTheCpuBitForBit) {
  MT_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  std::vector<int64_t> ids(8 * 512);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i % 3 == 0 ? 0 : int64_t((i * 7919) % 97);
  const Array id_array = Array::from_vector(ids, {8, 512});
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Array table = cast(random_normal({120, 768}, 41), dtype);
    const Array cot = cast(random_normal({8, 512, 768}, 42), dtype);
    const auto gradient_on = [&](Device d) {
      const Array ids_here = id_array.to(d);
      const auto fn = [&](const std::vector<Array>& x) { return embedding(x[0], ids_here); };
      return vjp(fn, {table.to(d)}, cot.to(d)).second[0].to(Device::cpu());
    };
    const Array cpu = gradient_on(Device::cpu());
    const Array gpu_first = gradient_on(gpu), gpu_second = gradient_on(gpu);
    const std::string label = std::string("embedding gradient ") + dtype_name(dtype);
    std::cout << "  [max err] " << label << ", gpu vs cpu: " << max_abs_diff(gpu_first, cpu) << "\n";
    ASSERT_EQ(gpu_first.nbytes(), cpu.nbytes());
    EXPECT_EQ(std::memcmp(gpu_first.raw(), cpu.raw(), cpu.nbytes()), 0) << label << ": GPU and CPU bits differ";
    EXPECT_EQ(std::memcmp(gpu_first.raw(), gpu_second.raw(), cpu.nbytes()), 0) << label << ": two GPU runs differ";
  }
}

// A linear layer's bias in cuBLASLt's epilogue equals the CPU's product + add at GPT-2's sizes:
// f32 (exactly as the GEMMs agree), TF32 and bf16 products, both weight layouts, and a bias
// whose address is not 16-byte aligned (the product, then a pass adding it).
TEST(GpuPrimitives, LinearBiasEpilogueEqualsTheCpu) {
  MT_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const Array x = random_normal({4, 256, 768}, 21), w = random_normal({2304, 768}, 22), b = random_normal({2304}, 23);
  const Array odd_bias = concatenate({Array::zeros({1}), b}, 0);  // b at a 4-byte offset once viewed
  for (MatmulPrecision precision : {MatmulPrecision::f32, MatmulPrecision::tf32, MatmulPrecision::bf16}) {
    MatmulPrecisionScope scope(precision);
    for (DType dtype : {DType::f32, DType::bf16}) {
      if (dtype == DType::bf16 && precision != MatmulPrecision::f32) continue;
      const std::string label = std::string("linear_bias ") + matmul_precision_name(precision) + " " + dtype_name(dtype);
      const Array xc = cast(x, dtype), wc = cast(w, dtype), bc = cast(b, dtype);
      const Array ref = add(matmul(xc, wc, false, true), bc);
      const Tolerance tol = dtype == DType::bf16 || precision == MatmulPrecision::bf16 ? Tolerance{3e-2, 3e-2, 3e-2}
                            : precision == MatmulPrecision::tf32                     ? Tolerance{2e-2, 2e-2, 2e-2}
                                                                                     : Tolerance{1e-4, 1e-4, 1e-4};
      DeviceScope on(gpu);
      const Array xg = xc.to(gpu), wg = wc.to(gpu);
      expect_close(linear_bias(xg, wg, bc.to(gpu), true).to(Device::cpu()), ref, tol, label);
      const Array shifted = cast(odd_bias, dtype).to(gpu).view_elements(1, Shape{2304});
      expect_close(linear_bias(xg, wg, shifted, true).to(Device::cpu()), ref, tol, label + " (unaligned bias)");
      const Array wt = transpose(wc, {1, 0});
      expect_close(linear_bias(xg, wt.to(gpu), bc.to(gpu), false).to(Device::cpu()), add(matmul(xc, wt), bc), tol,
                   label + " [in, out]");
    }
  }
}

// The cuBLASLt plans are bounded like the CPU's: past the capacity the shape unused longest is
// dropped (and made again when it returns), a kept one is not, and every product stays right,
// the bias epilogue's included.
TEST(GpuPrimitives, MatmulPlanCacheDropsTheShapeUnusedLongest) {
  MT_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  MatmulPrecisionScope exact(MatmulPrecision::f32);
  // Inputs and references on the CPU, made before the GPU scope opens (inside it new arrays
  // would be made on the GPU, and the references would run on the plans under test).
  const Array w = random_normal({64, 48}, 31), b = random_normal({48}, 32);
  std::map<int64_t, std::pair<Array, Array>> rows_cases;  // M -> (x, x @ w)
  for (int64_t rows : {5, 6, 7, 8}) {
    const Array x = random_normal({rows, 64}, 40 + rows);
    rows_cases.emplace(rows, std::make_pair(x, matmul(x, w)));
  }
  const Array x9 = random_normal({9, 64}, 50);
  const Array ref9 = add(matmul(x9, w), b);
  const size_t previous = cuda::set_matmul_cache_capacity(3);
  EXPECT_LE(cuda::matmul_cache_size(), 3u);
  DeviceScope on(gpu);
  const Array wg = w.to(gpu), bg = b.to(gpu);
  auto product = [&](int64_t rows) {
    const auto& [x, ref] = rows_cases.at(rows);
    expect_close(matmul(x.to(gpu), wg).to(Device::cpu()), ref, {1e-4, 1e-4, 1e-4}, "matmul M=" + std::to_string(rows));
  };
  for (int64_t rows : {5, 6, 7}) product(rows);
  const uint64_t created = cuda::matmul_plans_created();
  product(5);  // M=5 is used again: M=6 is now the one unused longest
  EXPECT_EQ(cuda::matmul_plans_created(), created) << "a cached plan was made again";
  product(8);  // past the capacity: M=6 goes
  EXPECT_EQ(cuda::matmul_plans_created(), created + 1);
  EXPECT_EQ(cuda::matmul_cache_size(), 3u);
  product(5);
  product(7);
  EXPECT_EQ(cuda::matmul_plans_created(), created + 1) << "a kept plan was made again";
  product(6);
  EXPECT_EQ(cuda::matmul_plans_created(), created + 2) << "the dropped plan was not made again";
  expect_close(linear_bias(x9.to(gpu), wg, bg, false).to(Device::cpu()), ref9, {1e-4, 1e-4, 1e-4},
               "linear_bias past the capacity");
  EXPECT_EQ(cuda::matmul_cache_size(), 3u);
  EXPECT_THROW(cuda::set_matmul_cache_capacity(0), std::runtime_error);
  cuda::set_matmul_cache_capacity(previous);
}

// Dropout masks are bit-identical to the CPU's for the same key, on the vectorized path (f32,
// a multiple of 4 elements) and the scalar ones (odd sizes, bf16), and so are large reductions
// and broadcasts (the split-row reduction, the bias and column broadcasts).
TEST(GpuPrimitives, LargeShapesTakeTheFastPathsAndStillEqualTheCpu) {
  MT_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  for (const Shape& shape : {Shape{64, 1024}, Shape{7, 333}}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const Array x = cast(random_normal(shape, 11), dtype);
      const RngKey key{3, 9};
      const Array cpu = dropout(x, 0.1, key, true);
      Array on_gpu;
      {
        DeviceScope scope(gpu);
        on_gpu = dropout(x.to(gpu), 0.1, key, true);
      }
      EXPECT_EQ(max_abs_diff(on_gpu.to(Device::cpu()), cpu), 0.0) << "dropout " << dtype_name(dtype) << shape.str();
    }
  }
  const Array big = random_normal({4096, 768}, 12), bias = random_normal({768}, 13), column = random_normal({4096, 1}, 14);
  DeviceScope scope(gpu);
  expect_close(sum(big.to(gpu), {0}).to(Device::cpu()), sum(big, {0}), {1e-5, 1e-5, 1e-5}, "column sum of (4096, 768)");
  EXPECT_EQ(max_abs_diff(add(big.to(gpu), bias.to(gpu)).to(Device::cpu()), add(big, bias)), 0.0) << "bias broadcast";
  EXPECT_EQ(max_abs_diff(mul(big.to(gpu), column.to(gpu)).to(Device::cpu()), mul(big, column)), 0.0)
      << "column broadcast";
  EXPECT_EQ(max_abs_diff(transpose(reshape(big.to(gpu), {64, 64, 12, 64}), {0, 2, 1, 3}).to(Device::cpu()),
                         transpose(reshape(big, {64, 64, 12, 64}), {0, 2, 1, 3})),
            0.0)
      << "head transpose";
}

// The 16-byte and per-4-element paths at sizes that take them, and at one that leaves a tail:
// a same-shape bf16 add and mul, x + dropout(branch) over a whole array (one Philox block per
// 4 elements), bit for bit; the cross-entropy over rows of GPT-2's padded vocabulary (16-byte
// loads, the 2-D backward) and of an odd width, with and without smoothing, within tolerance.
TEST(GpuPrimitives, VectorPathsEqualTheCpu) {
  MT_REQUIRE_GPU();
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  const RngKey key{5, 2};
  for (const Shape& shape : {Shape{64, 1024}, Shape{7, 333}}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const Array x = cast(random_normal(shape, 51), dtype), y = cast(random_normal(shape, 52), dtype);
      Array sum_gpu, product_gpu, dropped_gpu;
      {
        DeviceScope scope(gpu);
        sum_gpu = add(x.to(gpu), y.to(gpu));
        product_gpu = mul(x.to(gpu), y.to(gpu));
        dropped_gpu = add_dropout(x.to(gpu), y.to(gpu), 0.1, key, true);
      }
      const std::string label = std::string(dtype_name(dtype)) + shape.str();
      EXPECT_EQ(max_abs_diff(sum_gpu.to(cpu), add(x, y)), 0.0) << "add " << label;
      EXPECT_EQ(max_abs_diff(product_gpu.to(cpu), mul(x, y)), 0.0) << "mul " << label;
      EXPECT_EQ(max_abs_diff(dropped_gpu.to(cpu), add_dropout(x, y, 0.1, key, true)), 0.0) << "add_dropout " << label;
    }
  }
  for (int64_t classes : {int64_t(50304), int64_t(1003)}) {
    std::vector<int64_t> ids(24);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 997) % classes;
    ids[5] = -100;
    const Array labels = Array::from_vector(ids, {24});
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (double smoothing : {0.0, 0.1}) {
        const std::vector<Array> in = {cast(random_normal({24, classes}, 61), dtype)};
        auto fn = [&](const std::vector<Array>& z) {
          return cross_entropy(z[0], z[0].device().is_cuda() ? labels.to(z[0].device()) : labels, -100, smoothing);
        };
        const Array cot = Array::scalar(1.0, DType::f32);
        const auto [ref, ref_grads] = vjp(fn, in, cot);
        const auto [out, grads] = vjp_on_gpu(fn, in, cot);
        const std::string label = "cross_entropy (24, " + std::to_string(classes) + ") " + dtype_name(dtype) +
                                  " smoothing " + std::to_string(smoothing);
        expect_close(out.to(cpu), ref, default_tolerance(DType::f32), label + " forward, gpu vs cpu");
        expect_close(grads[0].to(cpu), ref_grads[0], default_tolerance(dtype), label + " gradient, gpu vs cpu");
      }
    }
  }
}

// An attention function's output and its q, k, v gradients on the GPU (under `gpu_precision`
// when given) against the CPU's, each max error printed as "<label> forward<suffix>",
// "<label> dq<suffix>", ...
void expect_attention_gpu_equals_cpu(const OpFn& fn, const std::vector<Array>& in, const Array& cot,
                                     const Tolerance& tol, const std::string& label,
                                     const std::string& suffix = ", gpu vs cpu",
                                     std::optional<MatmulPrecision> gpu_precision = std::nullopt) {
  const auto [ref, ref_grads] = vjp(fn, in, cot);
  std::optional<MatmulPrecisionScope> scope;
  if (gpu_precision) scope.emplace(*gpu_precision);
  const auto [out, grads] = vjp_on_gpu(fn, in, cot);
  expect_close(out.to(Device::cpu()), ref, tol, label + " forward" + suffix);
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::string name = grads.size() == 1 ? std::string(" dqkv") : std::string(" d") + "qkv"[i];
    expect_close(grads[i].to(Device::cpu()), ref_grads[i], tol, label + name + suffix);
  }
}

// The fused attention kernels at model sizes (several tiles, a causal offset, dropout, both
// head-dim templates) against the CPU kernel: forward and the three gradients.
TEST(GpuPrimitives, FlashAttentionAtModelSizesEqualsTheCpuKernel) {
  MT_REQUIRE_GPU();
  const RngKey key{11, 4};
  for (int64_t d : {64, 24}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const std::vector<Array> in = {cast(random_normal({2, 4, 130, d}, 21), dtype),
                                     cast(random_normal({2, 4, 200, d}, 22), dtype),
                                     cast(random_normal({2, 4, 200, d}, 23), dtype)};
      auto fn = [&](const std::vector<Array>& x) { return flash_attention(x[0], x[1], x[2], 0.125, true, 0.1, key); };
      const Array cot = cast(random_normal({2, 4, 130, d}, 24), dtype);
      const Tolerance tol = dtype == DType::f32 ? Tolerance{1e-5, 1e-5, 1e-5} : default_tolerance(dtype);
      expect_attention_gpu_equals_cpu(fn, in, cot, tol,
                                      "flash_attention d=" + std::to_string(d) + " " + dtype_name(dtype));
    }
  }
}

// The tensor-core kernels under --precision tf32 and bf16 (TF32 or bf16 products, f32
// softmax and accumulation) against the CPU's f32 kernel, within those formats' rounding.
TEST(GpuPrimitives, FlashAttentionOnTensorCoresTakesTheMatmulPrecision) {
  MT_REQUIRE_GPU();
  const RngKey key{12, 5};
  for (const auto& [precision, tol] : std::vector<std::pair<MatmulPrecision, Tolerance>>{
           {MatmulPrecision::tf32, {5e-3, 5e-3, 5e-3}}, {MatmulPrecision::bf16, default_tolerance(DType::bf16)}}) {
    for (int64_t d : {64, 32}) {
      const std::vector<Array> in = {random_normal({2, 3, 130, d}, 41), random_normal({2, 3, 200, d}, 42),
                                     random_normal({2, 3, 200, d}, 43)};
      auto fn = [&](const std::vector<Array>& x) {
        return flash_attention(x[0], x[1], x[2], 1.0 / std::sqrt(double(d)), true, 0.1, key);
      };
      const Array cot = random_normal({2, 3, 130, d}, 44);
      expect_attention_gpu_equals_cpu(
          fn, in, cot, tol, std::string("flash_attention ") + matmul_precision_name(precision) + " d=" + std::to_string(d),
          ", gpu vs cpu f32", precision);
    }
  }
}

// A bool (B, 1, 1, Tk) key mask: batch row r attends to key j where keep(r, j).
Array key_mask_where(int64_t b, int64_t tk, const std::function<bool(int64_t, int64_t)>& keep) {
  std::vector<float> k(size_t(b * tk));
  for (int64_t r = 0; r < b; ++r)
    for (int64_t j = 0; j < tk; ++j) k[size_t(r * tk + j)] = keep(r, j) ? 1.0f : 0.0f;
  return cast(Array::from_vector(k, {b, 1, 1, tk}), DType::boolean);
}

// A key-padding mask: batch row r attends to its first lengths[r] keys.
Array key_padding_mask(const std::vector<int64_t>& lengths, int64_t tk) {
  return key_mask_where(int64_t(lengths.size()), tk, [&](int64_t r, int64_t j) { return j < lengths[size_t(r)]; });
}

// Whether the tensor-core kernels take `dtype` arrays at head dim d on this GPU; says so when
// not (f32 tiles past d 64 need more shared memory than sm_86/89 grant a block).
bool tensor_cores_take(DType dtype, int64_t d, const std::string& label) {
  const Device gpu = Device::cuda(0);
  DeviceScope scope(gpu);
  if (cuda::flash_attention_tensor_cores(Array::empty({1, 1, 1, d}, dtype, gpu), d)) return true;
  std::cout << "  " << label << ": the GPU grants too little shared memory per block, not tested\n";
  return false;
}

// bf16 arrays and head dims past 64 on the tensor cores (LLaMA's 128, 80, and 48 padded to
// 64; 100 and 90 load their tiles element by element in bf16, 90 in f32 too): bf16 arrays multiply as bf16 with f32 softmax and accumulation and are written as bf16,
// within bf16's rounding of the CPU kernel (which widens them to f32); f32 arrays stay within
// f32 rounding under the default precision. Causal with dropout, and not causal with a
// key-padding mask (BERT), several tiles and a causal offset.
TEST(GpuPrimitives, FlashAttentionTakesBf16ArraysAndHeadDimsTo128) {
  MT_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  for (int64_t d : {128, 100, 90, 80, 48}) {
    for (DType dtype : {DType::bf16, DType::f32}) {
      const std::string label = "flash_attention " + std::string(dtype_name(dtype)) + " d=" + std::to_string(d);
      // bf16 tiles fit every sm_80+ GPU's shared memory; f32 ones past d 64 not sm_86/89's.
      const bool tensor_cores = tensor_cores_take(dtype, d, label);
      if (dtype == DType::bf16) {
        ASSERT_TRUE(tensor_cores) << "bf16 d=" << d;
      }
      if (!tensor_cores) continue;
      const Tolerance tol = dtype == DType::f32 ? Tolerance{1e-5, 1e-5, 1e-5} : default_tolerance(dtype);
      const std::vector<Array> in = {cast(random_normal({2, 3, 130, d}, 71), dtype),
                                     cast(random_normal({2, 3, 200, d}, 72), dtype),
                                     cast(random_normal({2, 3, 200, d}, 73), dtype)};
      auto causal = [&](const std::vector<Array>& x) {
        return flash_attention(x[0], x[1], x[2], 1.0 / std::sqrt(double(d)), true, 0.1, RngKey{15, 8});
      };
      expect_attention_gpu_equals_cpu(causal, in, cast(random_normal({2, 3, 130, d}, 74), dtype), tol,
                                      label + " causal");
      const Array mask = key_padding_mask({90, 33}, 90);
      const std::vector<Array> enc = {cast(random_normal({2, 3, 90, d}, 75), dtype),
                                      cast(random_normal({2, 3, 90, d}, 76), dtype),
                                      cast(random_normal({2, 3, 90, d}, 77), dtype)};
      auto masked = [&](const std::vector<Array>& x) {
        return flash_attention(x[0], x[1], x[2], 1.0 / std::sqrt(double(d)), false, 0.1, RngKey{16, 9},
                               mask.device() == x[0].device() ? mask : mask.to(x[0].device()));
      };
      expect_attention_gpu_equals_cpu(masked, enc, cast(random_normal({2, 3, 90, d}, 78), dtype), tol,
                                      label + " key mask");
    }
  }
  // f16 arrays keep the CUDA-core kernels (head dims up to 64).
  DeviceScope scope(gpu);
  EXPECT_FALSE(cuda::flash_attention_tensor_cores(Array::empty({1, 1, 1, 64}, DType::f16, gpu), 64));
  EXPECT_FALSE(cuda::flash_attention_tensor_cores(Array::empty({1, 1, 1, 160}, DType::bf16, gpu), 160));
}

// Grouped-query heads on the GPU (6 query heads over 2 key/value heads, LLaMA's head dim 128
// and 64), causal with dropout and not causal with a key-padding mask, bf16 and f32: the
// tensor-core kernels read each key/value head for its group and sum its gradients over the
// group, as the CPU kernel does. f16 arrays (d 64, causal) take the CUDA-core kernels.
TEST(GpuPrimitives, FlashAttentionGroupedHeadsEqualTheCpuKernel) {
  MT_REQUIRE_GPU();
  const Array mask = key_padding_mask({90, 50}, 90);
  for (int64_t d : {128, 64}) {
    for (DType dtype : {DType::bf16, DType::f32, DType::f16}) {
      if (dtype == DType::f16 && d > 64) continue;
      const std::string label = "flash_attention 6/2 heads " + std::string(dtype_name(dtype)) + " d=" + std::to_string(d);
      if (dtype != DType::f16 && !tensor_cores_take(dtype, d, label)) continue;
      const Tolerance tol = dtype == DType::f32 ? Tolerance{1e-5, 1e-5, 1e-5} : default_tolerance(dtype);
      const std::vector<Array> in = {cast(random_normal({2, 6, 130, d}, 81), dtype),
                                     cast(random_normal({2, 2, 200, d}, 82), dtype),
                                     cast(random_normal({2, 2, 200, d}, 83), dtype)};
      auto causal = [&](const std::vector<Array>& x) {
        return flash_attention(x[0], x[1], x[2], 1.0 / std::sqrt(double(d)), true, 0.1, RngKey{17, 3});
      };
      expect_attention_gpu_equals_cpu(causal, in, cast(random_normal({2, 6, 130, d}, 84), dtype), tol, label + " causal");
      if (dtype == DType::f16) continue;  // key masks need the tensor-core kernels
      const std::vector<Array> enc = {cast(random_normal({2, 6, 90, d}, 85), dtype),
                                      cast(random_normal({2, 2, 90, d}, 86), dtype),
                                      cast(random_normal({2, 2, 90, d}, 87), dtype)};
      auto masked = [&](const std::vector<Array>& x) {
        return flash_attention(x[0], x[1], x[2], 1.0 / std::sqrt(double(d)), false, 0.1, RngKey{18, 4},
                               mask.device() == x[0].device() ? mask : mask.to(x[0].device()));
      };
      expect_attention_gpu_equals_cpu(masked, enc, cast(random_normal({2, 6, 90, d}, 88), dtype), tol, label + " key mask");
    }
  }
}

// Heads-inner (B, T, H, D) arrays on the tensor cores (read and written with H·D-element row
// strides): forward and gradients equal the CPU kernel's for grouped heads, causal with
// dropout and key-masked, head dims 64 (vector loads), 128 and 40 (element loads), f32 and
// bf16; and the GPU refuses the layout where only the CUDA-core kernels would run (f16).
TEST(GpuPrimitives, FlashAttentionHeadsInnerEqualsTheCpuKernel) {
  MT_REQUIRE_GPU();
  const Array mask = key_padding_mask({90, 50}, 90);
  for (int64_t d : {64, 128, 40}) {
    for (DType dtype : {DType::bf16, DType::f32}) {
      const std::string label = "flash_attention heads inner " + std::string(dtype_name(dtype)) + " d=" + std::to_string(d);
      if (!tensor_cores_take(dtype, d, label)) continue;
      const Tolerance tol = dtype == DType::f32 ? Tolerance{1e-5, 1e-5, 1e-5} : default_tolerance(dtype);
      const std::vector<Array> in = {cast(random_normal({2, 130, 6, d}, 91), dtype),
                                     cast(random_normal({2, 200, 2, d}, 92), dtype),
                                     cast(random_normal({2, 200, 2, d}, 93), dtype)};
      auto causal = [&](const std::vector<Array>& x) {
        return flash_attention_heads_inner(x[0], x[1], x[2], 1.0 / std::sqrt(double(d)), true, 0.1, RngKey{19, 3});
      };
      expect_attention_gpu_equals_cpu(causal, in, cast(random_normal({2, 130, 6, d}, 94), dtype), tol, label + " causal");
      const std::vector<Array> enc = {cast(random_normal({2, 90, 6, d}, 95), dtype),
                                      cast(random_normal({2, 90, 2, d}, 96), dtype),
                                      cast(random_normal({2, 90, 2, d}, 97), dtype)};
      auto masked = [&](const std::vector<Array>& x) {
        return flash_attention_heads_inner(x[0], x[1], x[2], 1.0 / std::sqrt(double(d)), false, 0.1, RngKey{20, 4},
                                           mask.device() == x[0].device() ? mask : mask.to(x[0].device()));
      };
      expect_attention_gpu_equals_cpu(masked, enc, cast(random_normal({2, 90, 6, d}, 98), dtype), tol, label + " key mask");
    }
  }
  const Device gpu = Device::cuda(0);
  DeviceScope scope(gpu);
  const Array h16 = Array::zeros({1, 8, 2, 32}, DType::f16, gpu);
  expect_error([&] { flash_attention_heads_inner(h16, h16, h16, 1.0, true); },
               {"[flash_attention]", "heads-inner", "tensor-core"});
}

// A packed (B, T, H + 2·Hkv, D) q | k | v projection on the tensor cores (q, k and v read at
// their head offsets with the packed row stride, out and dO contiguous, the gradient written
// packed): forward and gradient equal the CPU kernel's, grouped heads, causal with dropout and
// key-masked, head dims 64, 128, 40 and 36 (bf16: element loads from the views), f32 and bf16.
TEST(GpuPrimitives, FlashAttentionPackedEqualsTheCpuKernel) {
  MT_REQUIRE_GPU();
  const Array mask = key_padding_mask({90, 50}, 90);
  for (int64_t d : {64, 128, 40, 36}) {
    for (DType dtype : {DType::bf16, DType::f32}) {
      const std::string label = "flash_attention packed " + std::string(dtype_name(dtype)) + " d=" + std::to_string(d);
      if (!tensor_cores_take(dtype, d, label)) continue;
      const Tolerance tol = dtype == DType::f32 ? Tolerance{1e-5, 1e-5, 1e-5} : default_tolerance(dtype);
      auto causal = [&](const std::vector<Array>& x) {
        return flash_attention_packed(x[0], 6, 2, 1.0 / std::sqrt(double(d)), true, 0.1, RngKey{21, 3});
      };
      expect_attention_gpu_equals_cpu(causal, {cast(random_normal({2, 130, 10, d}, 101), dtype)},
                                      cast(random_normal({2, 130, 6, d}, 102), dtype), tol, label + " causal");
      auto masked = [&](const std::vector<Array>& x) {
        return flash_attention_packed(x[0], 6, 2, 1.0 / std::sqrt(double(d)), false, 0.1, RngKey{22, 4},
                                      mask.device() == x[0].device() ? mask : mask.to(x[0].device()));
      };
      expect_attention_gpu_equals_cpu(masked, {cast(random_normal({2, 90, 10, d}, 103), dtype)},
                                      cast(random_normal({2, 90, 6, d}, 104), dtype), tol, label + " key mask");
    }
  }
}

// cuDNN's fused attention (MT_ATTENTION_CUDNN=1; cuda/cudnn_attention.h) against the CPU
// kernel, forward and gradients: bf16 arrays at head dims 64 and 128, causal over several
// tiles and an odd length, not causal with Tq != Tk, heads inner and a packed projection,
// grouped-query heads (each group's dK and dV summed); f16 at head dim 64. All without dropout, the route's condition; with dropout
// it leaves the arrays to the kernels here. The test fails when cuDNN refused a shape, with
// cuDNN's reason.
TEST(GpuPrimitives, CudnnAttentionEqualsTheCpuKernel) {
  MT_REQUIRE_GPU();
  std::optional<ScopedEnv> route;
  route.emplace("MT_ATTENTION_CUDNN", "1");
  const uint64_t forwards = cuda::cudnn_attention_forwards(), backwards = cuda::cudnn_attention_backwards();
  auto arrays = [](DType dtype, std::initializer_list<Shape> shapes, uint64_t seed) {
    std::vector<Array> xs;
    for (const Shape& sh : shapes) xs.push_back(cast(random_normal(sh, seed++), dtype));
    return xs;
  };
  for (int64_t d : {64, 128}) {
    const double scale = 1.0 / std::sqrt(double(d));
    const Tolerance tol = default_tolerance(DType::bf16);
    const std::string at = " d=" + std::to_string(d);
    const DType bf = DType::bf16;
    auto causal = [&](const std::vector<Array>& x) { return flash_attention(x[0], x[1], x[2], scale, true); };
    auto full = [&](const std::vector<Array>& x) { return flash_attention(x[0], x[1], x[2], scale, false); };
    expect_attention_gpu_equals_cpu(causal, arrays(bf, {{2, 3, 300, d}, {2, 3, 300, d}, {2, 3, 300, d}}, 111),
                                    arrays(bf, {{2, 3, 300, d}}, 114)[0], tol, "cudnn attention causal" + at);
    expect_attention_gpu_equals_cpu(full, arrays(bf, {{2, 3, 130, d}, {2, 3, 200, d}, {2, 3, 200, d}}, 121),
                                    arrays(bf, {{2, 3, 130, d}}, 124)[0], tol, "cudnn attention Tq 130 Tk 200" + at);
    auto inner = [&](const std::vector<Array>& x) {
      return flash_attention_heads_inner(x[0], x[1], x[2], scale, true);
    };
    expect_attention_gpu_equals_cpu(inner, arrays(bf, {{2, 200, 6, d}, {2, 200, 6, d}, {2, 200, 6, d}}, 141),
                                    arrays(bf, {{2, 200, 6, d}}, 144)[0], tol, "cudnn attention heads inner" + at);
    auto packed = [&](const std::vector<Array>& x) { return flash_attention_packed(x[0], 6, 6, scale, true); };
    expect_attention_gpu_equals_cpu(packed, arrays(bf, {{2, 200, 18, d}}, 151), arrays(bf, {{2, 200, 6, d}}, 152)[0],
                                    tol, "cudnn attention packed" + at);
    expect_attention_gpu_equals_cpu(causal, arrays(bf, {{2, 6, 257, d}, {2, 2, 257, d}, {2, 2, 257, d}}, 131),
                                    arrays(bf, {{2, 6, 257, d}}, 134)[0], tol, "cudnn attention 6/2 heads" + at);
  }
  auto causal64 = [](const std::vector<Array>& x) { return flash_attention(x[0], x[1], x[2], 0.125, true); };
  expect_attention_gpu_equals_cpu(causal64, arrays(DType::f16, {{2, 3, 150, 64}, {2, 3, 150, 64}, {2, 3, 150, 64}}, 161),
                                  arrays(DType::f16, {{2, 3, 150, 64}}, 164)[0], default_tolerance(DType::f16),
                                  "cudnn attention f16 causal d=64");
  const uint64_t ran_forward = cuda::cudnn_attention_forwards() - forwards;
  const uint64_t ran_backward = cuda::cudnn_attention_backwards() - backwards;
  // With dropout the kernels here run it (their Philox mask is the backward's and the CPU's).
  auto dropped = [](const std::vector<Array>& x) {
    return flash_attention(x[0], x[1], x[2], 0.125, true, 0.1, RngKey{25, 7});
  };
  expect_attention_gpu_equals_cpu(dropped, arrays(DType::bf16, {{1, 2, 64, 64}, {1, 2, 64, 64}, {1, 2, 64, 64}}, 171),
                                  arrays(DType::bf16, {{1, 2, 64, 64}}, 174)[0], default_tolerance(DType::bf16),
                                  "attention with dropout under MT_ATTENTION_CUDNN=1");
  EXPECT_EQ(cuda::cudnn_attention_forwards() - forwards, ran_forward) << "cuDNN took an attention with dropout";
  route.reset();
  std::cout << "  cuDNN ran " << ran_forward << " attention forwards and " << ran_backward << " backwards\n";
  EXPECT_GE(ran_forward, 11u) << "cuDNN's last refusal: " << cuda::cudnn_attention_last_refusal();
  EXPECT_GE(ran_backward, 11u) << "cuDNN's last refusal: " << cuda::cudnn_attention_last_refusal();
  EXPECT_EQ(cuda::cudnn_attention_last_refusal(), "");
}

// A key-padding mask on the cuDNN route: its bias on cuDNN, and the batches whose mask row
// unmasks no key on the tensor-core kernels after it (their rows attend uniformly, which the
// bias alone gives the forward but not the backward). Against the CPU kernel: BERT's shape
// (heads inner, prefix masks), a mask with holes, a batch with no visible key, a mask shared by
// every batch with Tq != Tk, and grouped heads.
TEST(GpuPrimitives, CudnnAttentionWithAKeyMaskEqualsTheCpuKernel) {
  MT_REQUIRE_GPU();
  const ScopedEnv route("MT_ATTENTION_CUDNN", "1");
  const uint64_t forwards = cuda::cudnn_attention_forwards(), backwards = cuda::cudnn_attention_backwards();
  const DType bf = DType::bf16;
  const Tolerance tol = default_tolerance(bf);
  auto normal = [&](const Shape& sh, uint64_t seed) { return cast(random_normal(sh, seed), bf); };
  // Batch 0 a prefix of 100 keys, batch 1 none, batch 2 every third key masked.
  const Array holes =
      key_mask_where(3, 128, [](int64_t r, int64_t j) { return r == 0 ? j < 100 : r == 2 && j % 3 != 0; });
  auto inner = [&](const std::vector<Array>& x) {
    return flash_attention_heads_inner(x[0], x[1], x[2], 0.125, false, 0.0, {}, holes.to(x[0].device()));
  };
  expect_attention_gpu_equals_cpu(inner, {normal({3, 128, 12, 64}, 191), normal({3, 128, 12, 64}, 192),
                                          normal({3, 128, 12, 64}, 193)},
                                  normal({3, 128, 12, 64}, 194), tol, "cudnn attention key mask, heads inner");
  const Array prefixes = key_padding_mask({128, 77, 5}, 128);
  auto packed = [&](const std::vector<Array>& x) {
    return flash_attention_packed(x[0], 12, 12, 0.125, false, 0.0, {}, prefixes.to(x[0].device()));
  };
  expect_attention_gpu_equals_cpu(packed, {normal({3, 128, 36, 64}, 195)}, normal({3, 128, 12, 64}, 196), tol,
                                  "cudnn attention key mask, packed (BERT)");
  // One mask row for both batches (the first 40 keys padded, and every seventh), head dim 128.
  const Array shared = key_mask_where(1, 256, [](int64_t, int64_t j) { return j >= 40 && j % 7 != 0; });
  auto one_row = [&](const std::vector<Array>& x) {
    return flash_attention(x[0], x[1], x[2], 0.0884, false, 0.0, {}, shared.to(x[0].device()));
  };
  expect_attention_gpu_equals_cpu(one_row, {normal({2, 4, 200, 128}, 197), normal({2, 4, 256, 128}, 198),
                                            normal({2, 4, 256, 128}, 199)},
                                  normal({2, 4, 200, 128}, 200), tol, "cudnn attention one mask row, Tq 200 Tk 256");
  const Array grouped_mask = key_mask_where(2, 64, [](int64_t r, int64_t j) { return r == 0 || j < 8; });
  auto grouped = [&](const std::vector<Array>& x) {
    return flash_attention(x[0], x[1], x[2], 0.125, false, 0.0, {}, grouped_mask.to(x[0].device()));
  };
  expect_attention_gpu_equals_cpu(grouped, {normal({2, 6, 64, 64}, 201), normal({2, 2, 64, 64}, 202),
                                            normal({2, 2, 64, 64}, 203)},
                                  normal({2, 6, 64, 64}, 204), tol, "cudnn attention key mask, 6/2 heads");
  const uint64_t ran_forward = cuda::cudnn_attention_forwards() - forwards;
  const uint64_t ran_backward = cuda::cudnn_attention_backwards() - backwards;
  std::cout << "  cuDNN ran " << ran_forward << " masked attention forwards and " << ran_backward << " backwards\n";
  EXPECT_GE(ran_forward, 4u) << "cuDNN's last refusal: " << cuda::cudnn_attention_last_refusal();
  EXPECT_GE(ran_backward, 4u) << "cuDNN's last refusal: " << cuda::cudnn_attention_last_refusal();
}

// Without dropout either route's backward takes the other's forward (the log-sum-exp and the
// masked score are the same): cuDNN's forward with the kernels' backward, and the reverse, for
// causal attention and for a key mask with holes and a batch with no visible key.
TEST(GpuPrimitives, CudnnAndKernelAttentionTakeEachOthersForward) {
  MT_REQUIRE_GPU();
  const DType bf = DType::bf16;
  auto normal = [&](const Shape& sh, uint64_t seed) { return cast(random_normal(sh, seed), bf); };
  const Array mask = key_padding_mask({0, 256, 100}, 256);  // batch 0 sees no key
  for (const char* forward_route : {"1", "0"}) {
    const std::string backward_route = std::string(forward_route) == "1" ? "0" : "1";
    const ScopedEnv outer("MT_ATTENTION_CUDNN", backward_route.c_str());  // in force when the backward runs
    const uint64_t forwards = cuda::cudnn_attention_forwards(), backwards = cuda::cudnn_attention_backwards();
    const std::string label = std::string("cudnn attention, forward on ") +
                              (backward_route == "0" ? "cuDNN, backward on the kernels" : "the kernels, backward on cuDNN");
    auto causal = [&](const std::vector<Array>& x) {
      const ScopedEnv inner("MT_ATTENTION_CUDNN", forward_route);  // the forward runs inside
      return flash_attention(x[0], x[1], x[2], 0.125, true);
    };
    expect_attention_gpu_equals_cpu(causal, {normal({2, 4, 256, 64}, 211), normal({2, 4, 256, 64}, 212),
                                             normal({2, 4, 256, 64}, 213)},
                                    normal({2, 4, 256, 64}, 214), default_tolerance(bf), label + " (causal)");
    auto masked = [&](const std::vector<Array>& x) {
      const ScopedEnv inner("MT_ATTENTION_CUDNN", forward_route);
      return flash_attention(x[0], x[1], x[2], 0.125, false, 0.0, {}, mask.to(x[0].device()));
    };
    expect_attention_gpu_equals_cpu(masked, {normal({3, 4, 256, 64}, 215), normal({3, 4, 256, 64}, 216),
                                             normal({3, 4, 256, 64}, 217)},
                                    normal({3, 4, 256, 64}, 218), default_tolerance(bf), label + " (key mask)");
    const uint64_t ran_forward = cuda::cudnn_attention_forwards() - forwards;
    const uint64_t ran_backward = cuda::cudnn_attention_backwards() - backwards;
    std::cout << "  " << label << ": cuDNN ran " << ran_forward << " forwards, " << ran_backward << " backwards\n";
    EXPECT_EQ(ran_forward, backward_route == "0" ? 2u : 0u) << cuda::cudnn_attention_last_refusal();
    EXPECT_EQ(ran_backward, backward_route == "1" ? 2u : 0u) << cuda::cudnn_attention_last_refusal();
  }
}

// MT_ATTENTION_CUDNN=auto: a shape's first calls alternate between the kernels and cuDNN (one
// warm-up and three timed calls each), then every call takes the faster. Ten forward and
// backward calls of one causal shape (a length no other test uses, so its trial starts here):
// each equals the CPU kernel whichever route ran it; cuDNN ran 4 calls of each direction in
// the trial (of the first 8) and the last 2 as well where chosen; both choices are said.
TEST(GpuPrimitives, CudnnAutoRouteTimesBothRoutesAndKeepsItsChoice) {
  MT_REQUIRE_GPU();
  const ScopedEnv route("MT_ATTENTION_CUDNN", "auto");
  const DType bf = DType::bf16;
  auto normal = [&](const Shape& sh, uint64_t seed) { return cast(random_normal(sh, seed), bf); };
  const std::vector<Array> in = {normal({2, 4, 392, 64}, 231), normal({2, 4, 392, 64}, 232),
                                 normal({2, 4, 392, 64}, 233)};
  const Array cot = normal({2, 4, 392, 64}, 234);
  auto fn = [](const std::vector<Array>& x) { return flash_attention(x[0], x[1], x[2], 0.125, true); };
  const auto [ref, ref_grads] = vjp(fn, in, cot);
  const uint64_t forwards = cuda::cudnn_attention_forwards(), backwards = cuda::cudnn_attention_backwards();
  const Tolerance tol = default_tolerance(bf);
  for (int call = 1; call <= 10; ++call) {
    const std::string label = "cudnn attention auto, call " + std::to_string(call);
    const auto [out, grads] = vjp_on_gpu(fn, in, cot);
    expect_close(out.to(Device::cpu()), ref, tol, label + " forward, gpu vs cpu");
    for (size_t i = 0; i < grads.size(); ++i)
      expect_close(grads[i].to(Device::cpu()), ref_grads[i], tol, label + " d" + "qkv"[i] + ", gpu vs cpu");
  }
  const uint64_t ran_forward = cuda::cudnn_attention_forwards() - forwards;
  const uint64_t ran_backward = cuda::cudnn_attention_backwards() - backwards;
  const std::string choices = cuda::cudnn_attention_measured_choices();
  std::cout << "  cuDNN ran " << ran_forward << " of 10 forwards and " << ran_backward << " of 10 backwards; chosen:\n"
            << choices;
  // The line of one direction of this shape, and the calls cuDNN ran by its choice.
  auto expected_runs = [&](const std::string& direction) -> uint64_t {
    const std::string head = "attention " + direction + " of B 2 H 4 Hkv 4 Tq 392 Tk 392 D 64 causal bf16: ";
    const size_t at = choices.find(head);
    EXPECT_NE(at, std::string::npos) << "no choice said for the " << direction << "; cuDNN's last refusal: "
                                     << cuda::cudnn_attention_last_refusal();
    if (at == std::string::npos) return 0;
    return choices.compare(at + head.size(), 6, "cuDNN ") == 0 ? 6 : 4;
  };
  EXPECT_EQ(ran_forward, expected_runs("forward"));
  EXPECT_EQ(ran_backward, expected_runs("backward"));
}

// MT_ATTENTION_CUDNN=all: attention with dropout on cuDNN, whose mask is its own (not the
// CPU's), so the checks are the mask's properties. The same key draws the same mask and
// another key another; with v all ones each output row is Σ_j mask·P / (1 - rate), whose mean
// over the rows is 1 (the rate and the scale) while rows differ from 1 (a mask was drawn).
// The backward must draw the forward's mask: the output is linear in v for a fixed mask, so
// ⟨dV, v2⟩ = ⟨dO, out(v2)⟩ for every v2 (three here), and the rows of dS sum to 0 when its
// softmax sum is the forward's, so Σ_j dK_j = 0 for each (batch, head, dim).
TEST(GpuPrimitives, CudnnAttentionWithDropoutDrawsOneMaskForwardAndBackward) {
  MT_REQUIRE_GPU();
  const ScopedEnv route("MT_ATTENTION_CUDNN", "all");
  const Device gpu = Device::cuda(0);
  DeviceScope scope(gpu);
  const uint64_t forwards = cuda::cudnn_attention_forwards(), backwards = cuda::cudnn_attention_backwards();
  const Shape shape{2, 3, 128, 64};
  auto bf = [&](uint64_t seed) { return cast(random_normal(shape, seed), DType::bf16).to(gpu); };
  const Array q = bf(181), k = bf(182), v = bf(183), cot = bf(185);
  auto attend = [&](const Array& keys, const Array& values, const RngKey& key) {
    return flash_attention(q, keys, values, 0.125, true, 0.1, key);
  };
  const RngKey key{26, 3};
  const Array a = attend(k, v, key).to(Device::cpu()), b = attend(k, v, key).to(Device::cpu());
  const Array other = attend(k, v, RngKey{27, 3}).to(Device::cpu());
  EXPECT_EQ(max_abs_diff(cast(a, DType::f32), cast(b, DType::f32)), 0.0) << "one key drew two masks";
  EXPECT_GT(max_abs_diff(cast(a, DType::f32), cast(other, DType::f32)), 0.0) << "two keys drew one mask";
  const std::vector<float> rows =
      cast(attend(k, Array::full(shape, 1.0, DType::bf16, gpu), key), DType::f32).to(Device::cpu()).to_floats();
  double mean = 0, farthest = 0;
  for (float r : rows) mean += r, farthest = std::max(farthest, std::abs(double(r) - 1.0));
  mean /= double(rows.size());
  std::cout << "  rows of dropout(P) · 1: mean " << mean << ", farthest from 1 by " << farthest << "\n";
  EXPECT_NEAR(mean, 1.0, 0.03);
  EXPECT_GT(farthest, 0.05);
  const std::vector<Array> grads =
      vjp([&](const std::vector<Array>& x) { return attend(x[0], x[1], key); }, {k, v}, cot).second;
  auto pairing = [](const Array& x, const Array& y) {
    return sum(mul(cast(x, DType::f32), cast(y, DType::f32))).to(Device::cpu()).to_doubles()[0];
  };
  for (uint64_t seed : {186, 187, 188}) {
    const Array v2 = bf(seed);
    const double backward_pairing = pairing(grads[1], v2), forward_pairing = pairing(attend(k, v2, key), cot);
    std::cout << "  <dV, v2> " << backward_pairing << " vs <dO, out(v2)> " << forward_pairing << "\n";
    EXPECT_NEAR(backward_pairing, forward_pairing, 0.005 * std::abs(forward_pairing) + 0.5);
  }
  const Array key_sums_per_dim = sum(cast(grads[0], DType::f32), {2}).to(Device::cpu());
  const double key_sums = max_abs_diff(key_sums_per_dim, zeros_like(key_sums_per_dim));
  const double rms = std::sqrt(pairing(grads[0], grads[0]) / double(grads[0].numel()));
  std::cout << "  |sum over keys of dK| " << key_sums << " against rms(dK) " << rms << "\n";
  EXPECT_LT(key_sums, 1e-2 * std::sqrt(128.0) * rms + 1e-3);
  EXPECT_GE(cuda::cudnn_attention_forwards() - forwards, 8u) << cuda::cudnn_attention_last_refusal();
  EXPECT_GE(cuda::cudnn_attention_backwards() - backwards, 1u) << cuda::cudnn_attention_last_refusal();
}

// BERT's attention on the GPU: not causal, a key-padding mask per batch row (lengths 77, 40,
// 1 and 0: a row with no key attends uniformly), dropout; forward and gradients equal the CPU
// kernel's.
TEST(GpuPrimitives, FlashAttentionWithAKeyPaddingMaskEqualsTheCpuKernel) {
  MT_REQUIRE_GPU();
  const int64_t b = 4, h = 2, t = 77, d = 64;
  const Array mask = key_padding_mask({77, 40, 1, 0}, t);
  const std::vector<Array> in = {random_normal({b, h, t, d}, 51), random_normal({b, h, t, d}, 52),
                                 random_normal({b, h, t, d}, 53)};
  // Per batch row; one row (length 40, then 0) for all.
  for (const Array& m : {mask, slice(mask, 0, 1, 2), slice(mask, 0, 3, 4)}) {
    auto fn = [&](const std::vector<Array>& x) {
      return flash_attention(x[0], x[1], x[2], 0.125, false, 0.1, RngKey{13, 6}, m.device() == x[0].device()
                                                                                      ? m
                                                                                      : m.to(x[0].device()));
    };
    expect_attention_gpu_equals_cpu(fn, in, random_normal({b, h, t, d}, 54), Tolerance{1e-5, 1e-5, 1e-5},
                                    "flash_attention key mask " + m.shape().str());
  }
}

// An attention function's output and q, k, v gradients on the GPU with the environment variable
// `variable` set to `value` (a kernel choice) and without it, bit for bit: the variable picks
// another path to the same arithmetic.
void expect_same_bits_with_and_without(const char* variable, const char* value, const OpFn& fn,
                                       const std::vector<Array>& in, const Array& cot, const std::string& label) {
  setenv(variable, value, 1);
  const auto [with, with_grads] = vjp_on_gpu(fn, in, cot);
  unsetenv(variable);
  const auto [without, without_grads] = vjp_on_gpu(fn, in, cot);
  EXPECT_EQ(max_abs_diff(with.to(Device::cpu()), without.to(Device::cpu())), 0.0) << label << " forward";
  for (size_t i = 0; i < with_grads.size(); ++i) {
    EXPECT_EQ(max_abs_diff(with_grads[i].to(Device::cpu()), without_grads[i].to(Device::cpu())), 0.0)
        << label << " d" << "qkv"[i];
  }
}

// The double-buffered kernels (bf16 arrays, the default) against the single-buffered ones
// (MT_ATTENTION_PIPELINE=0) bit for bit: the same products and sums in the same order, only
// the tiles' loads differ. Causal with more keys than queries, several tiles, dropout, grouped
// heads, at head dims 64 and 128; the GPT-2 shape's tile count per row.
TEST(GpuPrimitives, FlashAttentionDoubleBufferedEqualsSingleBufferedBitForBit) {
  MT_REQUIRE_GPU();
  for (int64_t d : {64, 128}) {
    const std::vector<Array> in = {cast(random_normal({2, 6, 300, d}, 81), DType::bf16),
                                   cast(random_normal({2, 2, 333, d}, 82), DType::bf16),
                                   cast(random_normal({2, 2, 333, d}, 83), DType::bf16)};
    const Array cot = cast(random_normal({2, 6, 300, d}, 84), DType::bf16);
    auto fn = [&](const std::vector<Array>& x) {
      return flash_attention(x[0], x[1], x[2], 1.0 / std::sqrt(double(d)), true, 0.1, RngKey{23, 5});
    };
    const uint64_t before = cuda::flash_attention_pipelined_launches();
    expect_same_bits_with_and_without("MT_ATTENTION_PIPELINE", "0", fn, in, cot,
                                      "flash_attention d=" + std::to_string(d) + " single vs double buffered");
    // A kernel's double-buffered form is declined where it would cost occupancy (it may be at
    // d 128): said (3 when the forward, dK/dV and dQ all took it), and at d 64 one at least must
    // have run, or the comparison compared nothing.
    const uint64_t piped = cuda::flash_attention_pipelined_launches() - before;
    std::cout << "  d=" << d << ": " << piped << " of 3 kernels double-buffered\n";
    if (d == 64) EXPECT_GE(piped, 1u) << "the double-buffered kernels never ran: the comparison compared nothing";
  }
}

// The backward reading the forward's dropout flags as bits (MT_ATTENTION_DROPOUT_BITS=1)
// against drawing them again, bit for bit: the same flags either way. Causal with more keys
// than queries and grouped heads (f32 and bf16), and a key-padding mask (bf16, 130 keys: a
// partial second key tile).
TEST(GpuPrimitives, FlashAttentionDropoutBitsEqualRedrawnFlagsBitForBit) {
  MT_REQUIRE_GPU();
  const Array mask = key_padding_mask({130, 70}, 130);
  for (DType dtype : {DType::bf16, DType::f32}) {
    for (bool masked : {false, true}) {
      if (masked && dtype == DType::f32) continue;
      const std::vector<Array> in =
          masked ? std::vector<Array>{cast(random_normal({2, 4, 130, 64}, 91), dtype),
                                      cast(random_normal({2, 4, 130, 64}, 92), dtype),
                                      cast(random_normal({2, 4, 130, 64}, 93), dtype)}
                 : std::vector<Array>{cast(random_normal({2, 6, 300, 64}, 91), dtype),
                                      cast(random_normal({2, 2, 333, 64}, 92), dtype),
                                      cast(random_normal({2, 2, 333, 64}, 93), dtype)};
      const Array cot = cast(random_normal(in[0].shape(), 94), dtype);
      auto fn = [&](const std::vector<Array>& x) {
        if (masked)
          return flash_attention(x[0], x[1], x[2], 0.125, false, 0.1, RngKey{24, 6}, mask.to(x[0].device()));
        return flash_attention(x[0], x[1], x[2], 0.125, true, 0.1, RngKey{24, 6});
      };
      const std::string label = std::string("flash_attention ") + dtype_name(dtype) + (masked ? " key mask" : " causal") +
                                ", dropout bits vs drawn again";
      setenv("MT_ATTENTION_DROPOUT_BITS", "1", 1);
      kernels::FlashAttentionShape shape;  // the op's, as far as the choice of bits goes
      shape.batch_heads = in[0].dim(0) * in[0].dim(1), shape.tq = in[0].dim(2), shape.tk = in[1].dim(2);
      shape.d = in[0].dim(3), shape.dropout_rate = 0.1;
      EXPECT_GT(cuda::dropout_keep_bits_words(in[0].to(Device::cuda(0)), shape), 0) << label << ": bits not taken";
      expect_same_bits_with_and_without("MT_ATTENTION_DROPOUT_BITS", "1", fn, in, cot, label);
    }
  }
}

// Shapes the model tests do not reach: a head dim between the kernels' 32 and 64 (48, zero-
// padded), more queries than keys without the causal mask, key counts not a multiple of 4
// (dropout elements straddling Philox blocks) and below one 64-key tile.
TEST(GpuPrimitives, FlashAttentionOddShapesEqualTheCpuKernel) {
  MT_REQUIRE_GPU();
  for (const auto& [qs, ks, causal] : std::vector<std::tuple<Shape, Shape, bool>>{
           {{2, 3, 150, 48}, {2, 3, 70, 48}, false}, {{1, 5, 37, 64}, {1, 5, 41, 64}, true}}) {
    const std::vector<Array> in = {random_normal(qs, 61), random_normal(ks, 62), random_normal(ks, 63)};
    const bool is_causal = causal;
    auto fn = [&](const std::vector<Array>& x) {
      return flash_attention(x[0], x[1], x[2], 0.2, is_causal, 0.1, RngKey{14, 7});
    };
    expect_attention_gpu_equals_cpu(fn, in, random_normal(qs, 64), Tolerance{1e-5, 1e-5, 1e-5},
                                    "flash_attention " + qs.str() + " keys " + ks.str());
  }
}

// More (batch · head) rows than a grid's y dimension holds (65535), and empty lengths.
TEST(GpuPrimitives, FlashAttentionEdgeShapes) {
  MT_REQUIRE_GPU();
  for (const auto& [qs, ks] : std::vector<std::pair<Shape, Shape>>{{{1100, 64, 2, 8}, {1100, 64, 3, 8}},
                                                                   {{2, 2, 0, 8}, {2, 2, 5, 8}}}) {
    const std::vector<Array> in = {random_normal(qs, 31), random_normal(ks, 32), random_normal(ks, 33)};
    auto fn = [](const std::vector<Array>& x) { return flash_attention(x[0], x[1], x[2], 0.3, true); };
    expect_attention_gpu_equals_cpu(fn, in, random_normal(qs, 34), Tolerance{1e-5, 1e-5, 1e-5},
                                    "flash_attention " + qs.str(), "");
  }
}

// A bad index on the GPU is reported like on the CPU (position, value, shapes), never a crash.
TEST(GpuPrimitives, BadIndicesAreReportedAsOnTheCpu) {
  MT_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const Array table = random_normal({5, 3}, 1).to(gpu);
  const Array ids = Array::from_vector(std::vector<int64_t>{0, 4, 7, 1}, {4}).to(gpu);
  expect_error([&] { embedding(table, ids); }, {"index 7 out of range [0, 5)", "flat position 2"});
}

// Out of device memory is an error naming the array and what is in use, not a crash.
TEST(GpuPrimitives, OutOfMemoryIsAnError) {
  MT_REQUIRE_GPU();
  expect_error([] { Array::empty({int64_t(1) << 40}, DType::f32, Device::cuda(0)); },
               {"f32(1099511627776", "out of GPU memory", "in use", "batch size"});
  const Array still_works = Array::full({4}, 1.0, DType::f32, Device::cuda(0));
  EXPECT_EQ(still_works.to_floats(), (std::vector<float>{1, 1, 1, 1}));
}

}  // namespace
}  // namespace mt::testing
