// cuDNN's fused attention graphs (backend/cuda/cudnn_attention_graphs.h) are made of
// descriptors that cuDNN checks as each is finalized: shapes, strides, data types and the
// operations' operands. Only the operation graph and its plan need a GPU. This test builds the
// forward and backward graphs where the CUDA backend is built and libcudnn loads (no GPU
// needed), for every layout the route takes, so a malformed graph fails here rather than
// first on a GPU machine; the plans and the results are gpu_primitives_test's.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "meshtrain/backend/attention.h"
#include "meshtrain/core/array.h"
#include "meshtrain/core/error.h"
#include "tests/support/scoped_env.h"

#if MT_WITH_CUDA
#include "meshtrain/backend/cuda/cudnn_attention.h"
#include "meshtrain/backend/cuda/cudnn_attention_graphs.h"
#endif

namespace mt::testing {
namespace {

#if MT_WITH_CUDA
// True when libcudnn loads here; the reason is printed when it does not.
bool cudnn_loads() {
  try {
    cuda::cudnn();
    return true;
  } catch (const std::exception& e) {
    std::cout << "  cuDNN does not load here: " << e.what() << "\n";
    return false;
  }
}

kernels::FlashAttentionShape shape(int64_t b, int64_t h, int64_t group, int64_t tq, int64_t tk, int64_t d, bool causal,
                                   bool heads_inner = false) {
  kernels::FlashAttentionShape s;
  s.batch_heads = b * h;
  s.heads = h;
  s.group = group;
  s.tq = tq;
  s.tk = tk;
  s.d = d;
  s.scale = 0.125f;
  s.causal = causal;
  s.heads_inner = heads_inner;
  return s;
}

// s with a key-padding mask of `rows` rows (the route reads only its presence and shape here).
kernels::FlashAttentionShape masked(kernels::FlashAttentionShape s, const bool* mask, int64_t rows) {
  s.key_mask = mask;
  s.mask_batches = rows;
  return s;
}

size_t operations_of(const kernels::FlashAttentionShape& s, DType dtype, bool backward = false, double dropout = 0.0) {
  cuda::cudnn_graph::Graph g;
  kernels::FlashAttentionShape with = s;
  with.dropout_rate = dropout;
  const cuda::CudnnAttentionGeometry geo = cuda::cudnn_attention_geometry(dtype, with);
  if (backward)
    cuda::build_cudnn_attention_backward(g, geo);
  else
    cuda::build_cudnn_attention_forward(g, geo);
  return g.operations().size();
}
#endif

TEST(CudnnAttentionGraph, EveryTensorAndOperationOfTheForwardFinalizes) {
#if MT_WITH_CUDA
  if (!cudnn_loads()) GTEST_SKIP() << "libcudnn is not on this machine";
  // Two products, the scale and softmax's seven (max, subtract, exp, sum, log, the
  // log-sum-exp, divide): 10; a causal mask adds four (two indices, a compare, a select).
  EXPECT_EQ(operations_of(shape(2, 12, 1, 1024, 1024, 64, true), DType::bf16), 14u);
  EXPECT_EQ(operations_of(shape(2, 12, 1, 128, 128, 64, false), DType::bf16), 10u);
  EXPECT_EQ(operations_of(shape(1, 8, 4, 77, 77, 128, true), DType::f16), 14u);           // grouped-query heads
  EXPECT_EQ(operations_of(shape(3, 4, 1, 5, 9, 32, false), DType::bf16), 10u);            // Tq != Tk, not causal
  EXPECT_EQ(operations_of(shape(2, 12, 1, 256, 256, 64, true, true), DType::bf16), 14u);  // heads inner
  kernels::FlashAttentionShape packed = shape(2, 6, 2, 256, 256, 128, true, true);
  packed.q_row_stride = packed.kv_row_stride = (6 + 2 * 3) * 128;  // one (B, T, H + 2·Hkv, D) projection
  EXPECT_EQ(operations_of(packed, DType::bf16), 14u);
  // Dropout (MT_ATTENTION_CUDNN=all): cuDNN's Bernoulli draw, the mask and the scale: 3 more.
  EXPECT_EQ(operations_of(shape(2, 12, 1, 1024, 1024, 64, true), DType::bf16, false, 0.1), 17u);
  EXPECT_EQ(operations_of(shape(2, 12, 1, 128, 128, 64, false), DType::f16, false, 0.1), 13u);
  // A key-padding mask: its bias added to the scaled scores, one more (BERT's shape: heads
  // inner, one mask row per batch; and a mask shared by every batch).
  bool mask[1024] = {};
  EXPECT_EQ(operations_of(masked(shape(2, 12, 1, 128, 128, 64, false, true), mask, 2), DType::bf16), 11u);
  EXPECT_EQ(operations_of(masked(shape(2, 12, 1, 1024, 1024, 64, true), mask, 1), DType::bf16), 15u);
  EXPECT_EQ(operations_of(masked(shape(2, 12, 1, 128, 128, 64, false, true), mask, 2), DType::bf16, false, 0.1), 14u);
  // The route's second try, should cuDNN refuse the bias's 0 stride: its rows written out.
  for (bool backward : {false, true}) {
    cuda::CudnnAttentionGeometry written =
        cuda::cudnn_attention_geometry(DType::bf16, masked(shape(2, 12, 1, 128, 128, 64, false, true), mask, 2));
    written.bias_rows_written = true;
    cuda::cudnn_graph::Graph g;
    if (backward)
      cuda::build_cudnn_attention_backward(g, written);
    else
      cuda::build_cudnn_attention_forward(g, written);
    EXPECT_EQ(g.operations().size(), backward ? 19u : 11u);
  }
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

TEST(CudnnAttentionGraph, EveryTensorAndOperationOfTheBackwardFinalizes) {
#if MT_WITH_CUDA
  if (!cudnn_loads()) GTEST_SKIP() << "libcudnn is not on this machine";
  // Σ dO·O (3), P again (S, scale, - Stats, exp: 4), dV (a transpose, a product), dS (a
  // product and three pointwise), dK (a transpose, a product), dQ (a transpose, a product
  // into f32, the rounding): 18; a causal mask adds four.
  EXPECT_EQ(operations_of(shape(2, 12, 1, 1024, 1024, 64, true), DType::bf16, true), 22u);
  EXPECT_EQ(operations_of(shape(2, 12, 1, 128, 128, 64, false), DType::bf16, true), 18u);
  EXPECT_EQ(operations_of(shape(3, 4, 1, 5, 9, 32, false), DType::f16, true), 18u);              // Tq != Tk
  EXPECT_EQ(operations_of(shape(2, 12, 1, 256, 256, 128, true, true), DType::bf16, true), 22u);  // heads inner
  kernels::FlashAttentionShape packed = shape(2, 6, 1, 256, 256, 64, true, true);
  packed.q_row_stride = packed.kv_row_stride = 3 * 6 * 64;
  EXPECT_EQ(operations_of(packed, DType::bf16, true), 22u);
  // Dropout: the draw, its mask and scale on P, the mask on dP, the scale on dS: 5 more.
  EXPECT_EQ(operations_of(shape(2, 12, 1, 1024, 1024, 64, true), DType::bf16, true, 0.1), 27u);
  EXPECT_EQ(operations_of(shape(2, 12, 1, 128, 128, 64, false), DType::bf16, true, 0.1), 23u);
  // Grouped-query heads: each group's dK and dV summed (two reductions more).
  EXPECT_EQ(operations_of(shape(1, 8, 4, 64, 64, 64, true), DType::bf16, true), 24u);
  EXPECT_EQ(operations_of(shape(2, 6, 3, 100, 100, 128, false, true), DType::bf16, true, 0.1), 25u);  // heads inner
  // A key-padding mask's bias, added where P is computed again: one more.
  bool mask[1024] = {};
  EXPECT_EQ(operations_of(masked(shape(2, 12, 1, 128, 128, 64, false, true), mask, 2), DType::bf16, true), 19u);
  EXPECT_EQ(operations_of(masked(shape(2, 12, 1, 1024, 1024, 64, true), mask, 1), DType::bf16, true), 23u);
  EXPECT_EQ(operations_of(masked(shape(2, 6, 3, 104, 104, 128, false, true), mask, 2), DType::bf16, true, 0.1), 26u);
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

// The checks are real: a product whose operands disagree is refused at its finalize, with an
// error that names it.
TEST(CudnnAttentionGraph, AMalformedGraphIsRefusedNamingTheOperation) {
#if MT_WITH_CUDA
  if (!cudnn_loads()) GTEST_SKIP() << "libcudnn is not on this machine";
  cuda::CudnnAttentionGeometry geo = cuda::cudnn_attention_geometry(DType::bf16, shape(2, 4, 1, 64, 64, 64, true));
  geo.kv_heads = 3;  // 4 query heads cannot share 3 key/value heads
  geo.k_strides = geo.v_strides = {3 * 64 * 64, 64 * 64, 64, 1};
  cuda::cudnn_graph::Graph g;
  try {
    cuda::build_cudnn_attention_forward(g, geo);
    FAIL() << "a product of 4 query heads with 3 key heads was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul operation S = Q Kt"), std::string::npos) << e.what();
    std::cout << "  refused: " << e.what() << "\n";
  }
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

// What the route leaves to the attention kernels, and why.
TEST(CudnnAttentionGraph, TheRouteSaysWhichArraysItLeavesToTheKernels) {
#if MT_WITH_CUDA
  const kernels::FlashAttentionShape s = shape(1, 2, 1, 16, 16, 64, true);
  const Array bf = Array::empty({1, 2, 16, 64}, DType::bf16), f32 = Array::empty({1, 2, 16, 64}, DType::f32);
  EXPECT_EQ(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, s), "");
  EXPECT_NE(cuda::cudnn_attention_ineligibility(f32, f32, f32, f32, s).find("f32 arrays"), std::string::npos);
  kernels::FlashAttentionShape dropped = s;
  dropped.dropout_rate = 0.1;
  EXPECT_NE(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, dropped).find("MT_ATTENTION_CUDNN=all"),
            std::string::npos);
  EXPECT_EQ(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, dropped, cuda::CudnnAttentionMode::all), "");
  kernels::FlashAttentionShape grouped = shape(1, 2, 2, 16, 16, 64, true);
  grouped.dropout_rate = 0.1;
  EXPECT_EQ(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, grouped, cuda::CudnnAttentionMode::all), "");
  kernels::FlashAttentionShape offset = shape(1, 2, 1, 8, 16, 64, true);
  EXPECT_NE(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, offset).find("Tq != Tk"), std::string::npos);
  EXPECT_NE(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, shape(1, 2, 1, 1, 1, 64, true)).find("one query"),
            std::string::npos);
  EXPECT_EQ(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, shape(1, 2, 1, 1, 16, 64, false)), "");
  kernels::FlashAttentionShape odd = shape(1, 2, 1, 16, 16, 60, false);
  EXPECT_NE(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, odd).find("head dim 60"), std::string::npos);
  // A key-padding mask: bf16 arrays, Tk a multiple of 8, one mask row or one per batch, not
  // causal.
  bool mask[16] = {};
  const Array f16 = Array::empty({1, 2, 16, 64}, DType::f16);
  const kernels::FlashAttentionShape full = shape(1, 2, 1, 16, 16, 64, false);
  EXPECT_EQ(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, masked(full, mask, 1)), "");
  EXPECT_NE(cuda::cudnn_attention_ineligibility(f16, f16, f16, f16, masked(full, mask, 1)).find("mask on f16"),
            std::string::npos);
  EXPECT_EQ(cuda::cudnn_attention_ineligibility(f16, f16, f16, f16, full), "");
  EXPECT_NE(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, masked(shape(1, 2, 1, 12, 12, 64, false), mask, 1))
                .find("over 12 keys"),
            std::string::npos);
  EXPECT_NE(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, masked(full, mask, 2)).find("2 rows for 1 batches"),
            std::string::npos);
  EXPECT_NE(cuda::cudnn_attention_ineligibility(bf, bf, bf, bf, masked(s, mask, 1)).find("with the causal mask"),
            std::string::npos);
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

// The masked score is bf16's lowest finite value, and any score of a sane size plus it rounds
// to it in f32: what lets the cuDNN route's additive bias give masked keys the kernels' score.
TEST(CudnnAttentionGraph, AMaskedScoreAbsorbsAnyScoreAddedToIt) {
  const uint32_t bits = 0xFF7F0000u;  // bf16 0xFF7F widened
  float lowest_bf16;
  std::memcpy(&lowest_bf16, &bits, sizeof(bits));
  EXPECT_EQ(kernels::kMaskedScore, lowest_bf16);
  for (float s : {-1e30f, -1e4f, -3.0f, 0.0f, 7.5f, 1e4f, 1e30f}) {
    volatile float sum = s + kernels::kMaskedScore;  // rounded to f32, as cuDNN's f32 add
    EXPECT_EQ(sum, kernels::kMaskedScore) << s;
  }
}

// The switch's values, and a clear error for any other.
TEST(CudnnAttentionGraph, TheSwitchTakesZeroOneAllOrAuto) {
#if MT_WITH_CUDA
  {
    const ScopedEnv unset("MT_ATTENTION_CUDNN", nullptr);
    EXPECT_EQ(cuda::cudnn_attention_mode(), cuda::CudnnAttentionMode::off);
  }
  {
    const ScopedEnv one("MT_ATTENTION_CUDNN", "1");
    EXPECT_EQ(cuda::cudnn_attention_mode(), cuda::CudnnAttentionMode::without_dropout);
  }
  {
    const ScopedEnv all("MT_ATTENTION_CUDNN", "all");
    EXPECT_EQ(cuda::cudnn_attention_mode(), cuda::CudnnAttentionMode::all);
  }
  {
    const ScopedEnv measured("MT_ATTENTION_CUDNN", "auto");
    EXPECT_EQ(cuda::cudnn_attention_mode(), cuda::CudnnAttentionMode::measured);
  }
  const ScopedEnv yes("MT_ATTENTION_CUDNN", "yes");
  try {
    cuda::cudnn_attention_mode();
    ADD_FAILURE() << "MT_ATTENTION_CUDNN=yes was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MT_ATTENTION_CUDNN='yes'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("0, 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto"), std::string::npos) << e.what();
  }
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

}  // namespace
}  // namespace mt::testing
