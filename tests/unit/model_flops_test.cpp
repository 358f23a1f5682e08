// MFU's two numbers: the model FLOPs counted from the GEMMs a GPT-2 step actually runs equal
// the 6·N·tokens + attention formula, and the measured GEMM peak is cached per machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "meshtrain/meshtrain.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/train/gemm_peak.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

TEST(ModelFlops, Gpt2StepMatchesTheFormula) {
  models::Gpt2Config c;
  c.vocab_size = 512;
  c.n_positions = 64;
  c.n_embd = 64;
  c.n_layer = 2;
  c.n_head = 4;
  const int64_t B = 2, T = 32;
  Params p = models::gpt2_init(c, RngKey{1, 0});
  Array ids = random_ints({B, T}, 5, 0, c.vocab_size), labels = random_ints({B, T}, 6, 0, c.vocab_size);
  const double before = prim::model_flops();
  auto [loss, grads] = value_and_grad([&](const Params& q) {
    return cross_entropy(models::gpt2_apply(c, q, {.input_ids = ids}, RngKey{2, 0}, true), labels);
  })(p);
  const double counted = prim::model_flops() - before;
  // 6 FLOPs per matmul weight per token (forward and two backward GEMMs), the tied LM head
  // included, plus the attention scores and weighted sums: 12·L·T·C per token (no causal discount).
  const double C = double(c.n_embd), L = double(c.n_layer), V = double(c.vocab_size), FF = 4 * C, tokens = double(B * T);
  const double N = L * (4 * C * C + 2 * C * FF) + V * C;
  const double formula = 6 * N * tokens + 12 * L * double(T) * C * tokens;
  const double rel = std::abs(counted - formula) / formula;
  std::cout << "  counted " << counted << " FLOPs, formula " << formula << ", rel err " << rel << "\n";
  EXPECT_LE(rel, 0.02);
}

TEST(ModelFlops, GemmPeakIsMeasuredOnceAndCached) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("mt_peak_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  EXPECT_EQ(train::gemm_peak_cache_path(), (dir / "meshtrain" / "gemm_peak.json").string());
  const double first = train::gemm_peak_gflops(DType::f32);
  EXPECT_GT(first, 1.0);
  std::ifstream in(train::gemm_peak_cache_path());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(train::gemm_peak_key(DType::f32)), std::string::npos) << text;
  EXPECT_EQ(train::gemm_peak_gflops(DType::f32), first);  // from the cache: the same number
  std::ofstream(train::gemm_peak_cache_path()) << "{ broken";
  EXPECT_GT(train::gemm_peak_gflops(DType::f32), 1.0);  // a damaged cache is measured again
  std::filesystem::remove_all(dir);
  unsetenv("XDG_CACHE_HOME");
}

}  // namespace
}  // namespace mt::testing
