// Scaled dot-product attention (causal, padding masks, grouped-query heads), rotary
// embeddings, and a whole transformer block forward and backward against PyTorch.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "meshtrain/backend/attention.h"
#include "meshtrain/prim/dispatch.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

// torch 1.13 has no F.scaled_dot_product_attention: the reference is written out.
const char* kTorchAttention = R"(
def attention(q, k, v, mask, causal):
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    allowed = torch.ones(s.shape, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    if causal:
        tq, tk = s.shape[-2], s.shape[-1]
        allowed = allowed & torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
    s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v
)";

TEST(AttentionOracle, CausalPaddingAndGroupedHeads) {
  struct Case {
    int64_t b, h, hkv, tq, tk, d;
    bool causal, padding;
  };
  const std::vector<Case> cases = {{2, 4, 4, 5, 5, 8, false, false}, {2, 4, 4, 5, 5, 8, true, false},
                                   {2, 4, 2, 3, 7, 8, true, false},  {2, 6, 3, 5, 5, 4, true, true},
                                   {1, 2, 1, 1, 9, 16, true, true}};
  for (const Case& c : cases) {
    for (DType dt : {DType::f32, DType::bf16}) {
      Array q = random_normal({c.b, c.h, c.tq, c.d}, 1, dt), k = random_normal({c.b, c.hkv, c.tk, c.d}, 2, dt),
            v = random_normal({c.b, c.hkv, c.tk, c.d}, 3, dt);
      // Padding: the first key of batch row 0 and the last two of the last row are masked.
      std::vector<int64_t> keep(size_t(c.b * c.tk), 1);
      keep[0] = 0;
      keep[size_t(c.b * c.tk - 1)] = 0;
      keep[size_t(c.b * c.tk - 2)] = 0;
      Array mask = c.padding ? cast(Array::from_vector(keep, {c.b, 1, 1, c.tk}), DType::boolean) : Array();
      std::vector<Array> inputs = {q, k, v};
      if (c.padding) inputs.push_back(mask);
      std::string code = std::string(kTorchAttention) + "out = attention(x0, x1, x2, " +
                         (c.padding ? "x3" : "None") + ", " + (c.causal ? "True" : "False") + ")";
      std::string label = "attention b" + std::to_string(c.b) + " h" + std::to_string(c.h) + "/" +
                          std::to_string(c.hkv) + " tq" + std::to_string(c.tq) + " tk" + std::to_string(c.tk) +
                          (c.causal ? " causal" : "") + (c.padding ? " padded" : "") + " " + dtype_name(dt);
      auto fn = [&](const std::vector<Array>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], c.padding ? in[3] : Array(), {.causal = c.causal});
      };
      check_against_torch(label, fn, code, inputs, default_tolerance(dt));
      if (dt == DType::f32) check_finite_differences(label, fn, inputs);
    }
  }
}

// The fused causal softmax alone (more keys than queries, a non-default scale), its VJP,
// and the VJP's own derivative (it is written with ops, so second-order gradients hold).
TEST(AttentionOracle, FusedCausalSoftmax) {
  const std::string code = R"(
tq, tk = x0.shape[-2], x0.shape[-1]
s = (x0.float() * 0.3).masked_fill(~torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq), float('-inf'))
out = torch.softmax(s, -1).to(x0.dtype)
)";
  for (DType dt : {DType::f32, DType::bf16}) {
    Array x = random_normal({2, 3, 4, 6}, 11, dt);
    auto fn = [](const std::vector<Array>& in) { return causal_softmax(in[0], 0.3); };
    check_against_torch(std::string("causal_softmax ") + dtype_name(dt), fn, code, {x}, default_tolerance(dt));
    if (dt == DType::f32) check_finite_differences("causal_softmax", fn, {x});
  }
  Array g = random_normal({2, 3, 4, 6}, 12);
  Array x = random_normal({2, 3, 4, 6}, 13);
  auto vjp_fn = [&](const std::vector<Array>& in) {
    return vjp([](const std::vector<Array>& a) { return causal_softmax(a[0], 0.3); }, in, g).second[0];
  };
  check_finite_differences("causal_softmax vjp (second order)", vjp_fn, {x});
  EXPECT_THROW(causal_softmax(random_normal({2, 5, 3}, 1), 1.0), Error);  // more queries than keys
}

// The fused primitive (flash_attention: the CPU kernel here, the GPU kernel in tests/gpu)
// equals the composed form with the same dropout masks: forward, first-order gradients, and
// gradients of gradients (which take the composed backward).
TEST(AttentionOracle, FlashAttentionEqualsTheComposedForm) {
  const RngKey key{7, 3};
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool causal : {true, false}) {
      const std::vector<Array> in = {cast(random_normal({2, 3, 9, 16}, 1), dtype), cast(random_normal({2, 3, 11, 16}, 2), dtype),
                                     cast(random_normal({2, 3, 11, 16}, 3), dtype)};
      AttentionOptions o;
      o.causal = causal, o.dropout_rate = 0.1, o.dropout_key = key, o.train = true;
      auto composed = [o](const std::vector<Array>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], Array(), o); };
      auto fused = [causal, key](const std::vector<Array>& x) {
        return flash_attention(x[0], x[1], x[2], 0.25, causal, 0.1, key);
      };
      const Tolerance tol = dtype == DType::f32 ? Tolerance{1e-5, 1e-5, 1e-6} : default_tolerance(dtype);
      const std::string label = std::string(dtype_name(dtype)) + (causal ? " causal" : " full");
      expect_close(fused(in), composed(in), tol, "flash_attention " + label + " forward");
      const Array cot = cast(random_normal({2, 3, 9, 16}, 4), dtype);
      const auto gf = vjp(fused, in, cot).second, gc = vjp(composed, in, cot).second;
      for (int i = 0; i < 3; ++i) expect_close(gf[size_t(i)], gc[size_t(i)], tol, label + " d" + "qkv"[i]);
      if (dtype != DType::f32) continue;
      auto second = [&](const OpFn& f) {
        return [&, f](const std::vector<Array>& x) { return vjp(f, x, cot).second[0]; };
      };
      const Array cot2 = random_normal({2, 3, 9, 16}, 5);
      const auto sf = vjp(second(fused), in, cot2).second, sc = vjp(second(composed), in, cot2).second;
      for (int i = 0; i < 3; ++i) expect_close(sf[size_t(i)], sc[size_t(i)], tol, label + " second order d" + "qkv"[i]);
    }
  }
}

// Grouped-query heads in the fused kernel (k and v with a third of q's heads, never
// repeated in memory) against the same kernel given the heads repeated: the same forward,
// and k's and v's gradients summed over each group; causal with dropout, and a key-padding
// mask; first and second order.
TEST(AttentionOracle, FlashAttentionGroupedHeadsEqualRepeatedHeads) {
  const RngKey key{9, 2};
  auto repeat3 = [](const Array& x) {  // (B, Hkv, T, D) -> (B, 3 Hkv, T, D), each head thrice
    return reshape(broadcast_to(reshape(x, {x.dim(0), x.dim(1), 1, x.dim(2), x.dim(3)}),
                                Shape{x.dim(0), x.dim(1), 3, x.dim(2), x.dim(3)}),
                   {x.dim(0), x.dim(1) * 3, x.dim(2), x.dim(3)});
  };
  std::vector<int64_t> keep(size_t(2 * 11), 1);
  for (int64_t j = 7; j < 11; ++j) keep[size_t(11 + j)] = 0;
  const Array mask = cast(Array::from_vector(keep, {2, 1, 1, 11}), DType::boolean);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool causal : {true, false}) {
      const std::vector<Array> in = {cast(random_normal({2, 6, 9, 16}, 31), dtype),
                                     cast(random_normal({2, 2, 11, 16}, 32), dtype),
                                     cast(random_normal({2, 2, 11, 16}, 33), dtype)};
      const Array m = causal ? Array() : mask;
      auto grouped = [&](const std::vector<Array>& x) { return flash_attention(x[0], x[1], x[2], 0.25, causal, 0.1, key, m); };
      auto repeated = [&](const std::vector<Array>& x) {
        return flash_attention(x[0], repeat3(x[1]), repeat3(x[2]), 0.25, causal, 0.1, key, m);
      };
      const std::string label = std::string("flash_attention 6/2 heads ") + dtype_name(dtype) + (causal ? " causal" : " key mask");
      const Tolerance tol = dtype == DType::f32 ? Tolerance{1e-6, 1e-5, 1e-6} : default_tolerance(dtype);
      EXPECT_EQ(max_abs_diff(grouped(in), repeated(in)), 0.0) << label << " forward";
      const Array cot = cast(random_normal({2, 6, 9, 16}, 34), dtype);
      const auto gg = vjp(grouped, in, cot).second, gr = vjp(repeated, in, cot).second;
      for (int i = 0; i < 3; ++i) expect_close(gg[size_t(i)], gr[size_t(i)], tol, label + " d" + "qkv"[i]);
      if (dtype != DType::f32) continue;
      auto second = [&](const OpFn& f) {
        return [&, f](const std::vector<Array>& x) { return vjp(f, x, cot).second[1]; };
      };
      const Array cot2 = random_normal({2, 2, 11, 16}, 35);
      const auto sg = vjp(second(grouped), in, cot2).second, sr = vjp(second(repeated), in, cot2).second;
      for (int i = 0; i < 3; ++i) expect_close(sg[size_t(i)], sr[size_t(i)], tol, label + " second order d" + "qkv"[i]);
    }
  }
  expect_error([] { flash_attention(Array::zeros({1, 3, 4, 8}), Array::zeros({1, 2, 4, 8}), Array::zeros({1, 2, 4, 8}), 1.0, true); },
               {"[flash_attention]", "Hkv dividing H", "(1, 3, 4, 8)", "(1, 2, 4, 8)"});
}

// The kernels read and write heads-inner (B, T, H, D) arrays in place: the same values as the
// (B, H, T, D) form on transposed arrays, bit for bit forward and backward (the same arithmetic
// on the same numbers), second order too, for causal and key-masked attention with dropout,
// grouped heads, f32 and bf16, and an odd head dim (the padded path). attention_heads_inner
// takes the fused kernel by default and the transposed composed form when asked for it.
TEST(AttentionOracle, HeadsInnerArraysEqualTheHeadsOuterForm) {
  const RngKey key{13, 4};
  std::vector<int64_t> keep(size_t(2 * 11), 1);
  for (int64_t j = 6; j < 11; ++j) keep[size_t(11 + j)] = 0;
  const Array mask = cast(Array::from_vector(keep, {2, 1, 1, 11}), DType::boolean);
  auto outer = [](const Array& x) { return swap_axes(x, 1, 2); };
  for (int64_t d : {16, 12}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (bool causal : {true, false}) {
        const std::vector<Array> in = {cast(random_normal({2, 9, 6, d}, 41), dtype),
                                       cast(random_normal({2, 11, 2, d}, 42), dtype),
                                       cast(random_normal({2, 11, 2, d}, 43), dtype)};
        const Array m = causal ? Array() : mask;
        auto inner = [&](const std::vector<Array>& x) {
          return flash_attention_heads_inner(x[0], x[1], x[2], 0.3, causal, 0.1, key, m);
        };
        auto transposed = [&](const std::vector<Array>& x) {
          return outer(flash_attention(outer(x[0]), outer(x[1]), outer(x[2]), 0.3, causal, 0.1, key, m));
        };
        const std::string label = std::string("heads inner d ") + std::to_string(d) + " " + dtype_name(dtype) +
                                  (causal ? " causal" : " key mask");
        EXPECT_EQ(max_abs_diff(inner(in), transposed(in)), 0.0) << label << " forward";
        const Array cot = cast(random_normal({2, 9, 6, d}, 44), dtype);
        const auto gi = vjp(inner, in, cot).second, gt = vjp(transposed, in, cot).second;
        for (int i = 0; i < 3; ++i) EXPECT_EQ(max_abs_diff(gi[size_t(i)], gt[size_t(i)]), 0.0) << label << " d" << "qkv"[i];
        if (dtype != DType::f32 || d != 16) continue;
        auto second = [&](const OpFn& f) {
          return [&, f](const std::vector<Array>& x) { return vjp(f, x, cot).second[1]; };
        };
        const Array cot2 = random_normal({2, 11, 2, d}, 45);
        const auto si = vjp(second(inner), in, cot2).second, st = vjp(second(transposed), in, cot2).second;
        for (int i = 0; i < 3; ++i)
          expect_close(si[size_t(i)], st[size_t(i)], {1e-6, 1e-5, 1e-6}, label + " second order d" + "qkv"[i]);
      }
    }
  }
  // The op: fused by default (one flash_attention, no transposes), composed on request; both
  // equal the (B, H, T, D) path the models took before.
  const std::vector<Array> in = {random_normal({2, 10, 4, 8}, 46), random_normal({2, 10, 4, 8}, 47),
                                 random_normal({2, 10, 4, 8}, 48)};
  AttentionOptions o;
  o.causal = true, o.dropout_rate = 0.1, o.dropout_key = key, o.train = true;
  const Array reference =
      outer(scaled_dot_product_attention(outer(in[0]), outer(in[1]), outer(in[2]), Array(), o));
  std::map<std::string, int> calls;
  prim::OpObserver previous = prim::set_op_observer([&](const prim::OpEvent& e) { ++calls[e.primitive.name()]; });
  const Array fused = attention_heads_inner(in[0], in[1], in[2], Array(), o);
  prim::set_op_observer(previous);
  EXPECT_EQ(calls["flash_attention"], 1);
  EXPECT_EQ(calls["transpose"], 0);
  EXPECT_EQ(max_abs_diff(fused, reference), 0.0);
  set_attention_kernel(AttentionKernel::composed);
  const Array composed = attention_heads_inner(in[0], in[1], in[2], Array(), o);
  set_attention_kernel(AttentionKernel::automatic);
  expect_close(composed, reference, {1e-6, 1e-5}, "attention_heads_inner, composed");
  expect_error([] { flash_attention_heads_inner(Array::zeros({1, 4, 3, 8}), Array::zeros({1, 4, 2, 8}),
                                                Array::zeros({1, 4, 2, 8}), 1.0, true); },
               {"[flash_attention]", "(B, Tq, H, D)", "(1, 4, 3, 8)"});
}

// One fused q | k | v projection's output, (B, T, H + 2·Hkv, D), read in place: the values and
// the packed gradient equal the heads-inner form's on its three slices bit for bit (grouped
// heads, causal with dropout and key-masked, f32 and bf16, a padded head dim), second order
// within 1e-6; the op runs one flash_attention with no slice or concatenation either way.
TEST(AttentionOracle, PackedProjectionEqualsTheHeadsInnerForm) {
  const RngKey key{14, 2};
  std::vector<int64_t> keep(size_t(2 * 11), 1);
  for (int64_t j = 4; j < 11; ++j) keep[size_t(j)] = 0;
  const Array mask = cast(Array::from_vector(keep, {2, 1, 1, 11}), DType::boolean);
  for (int64_t d : {16, 12}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (bool causal : {true, false}) {
        const std::vector<Array> in = {cast(random_normal({2, 11, 10, d}, 61), dtype)};  // 6 query, 2 + 2 kv heads
        const Array m = causal ? Array() : mask;
        auto packed = [&](const std::vector<Array>& x) {
          return flash_attention_packed(x[0], 6, 2, 0.3, causal, 0.1, key, m);
        };
        auto sliced = [&](const std::vector<Array>& x) {
          return flash_attention_heads_inner(slice(x[0], 2, 0, 6), slice(x[0], 2, 6, 8), slice(x[0], 2, 8, 10), 0.3,
                                             causal, 0.1, key, m);
        };
        const std::string label = std::string("packed d ") + std::to_string(d) + " " + dtype_name(dtype) +
                                  (causal ? " causal" : " key mask");
        EXPECT_EQ(max_abs_diff(packed(in), sliced(in)), 0.0) << label << " forward";
        const Array cot = cast(random_normal({2, 11, 6, d}, 62), dtype);
        EXPECT_EQ(max_abs_diff(vjp(packed, in, cot).second[0], vjp(sliced, in, cot).second[0]), 0.0)
            << label << " dqkv";
        if (dtype != DType::f32 || d != 16) continue;
        auto second = [&](const OpFn& f) {
          return [&, f](const std::vector<Array>& x) { return vjp(f, x, cot).second[0]; };
        };
        const Array cot2 = random_normal({2, 11, 10, d}, 63);
        expect_close(vjp(second(packed), in, cot2).second[0], vjp(second(sliced), in, cot2).second[0],
                     {1e-6, 1e-5, 1e-6}, label + " second order");
      }
    }
  }
  // The op: one flash_attention and no slice or concatenation in either pass; equal to
  // attention_heads_inner over the slices, and to the composed form on request.
  const std::vector<Array> in = {random_normal({2, 10, 12, 8}, 64)};  // 4 query heads, 4 + 4 kv
  AttentionOptions o;
  o.causal = true, o.dropout_rate = 0.1, o.dropout_key = key, o.train = true;
  auto sliced = [&](const std::vector<Array>& x) {
    return attention_heads_inner(slice(x[0], 2, 0, 4), slice(x[0], 2, 4, 8), slice(x[0], 2, 8, 12), Array(), o);
  };
  auto packed = [&](const std::vector<Array>& x) { return attention_packed(x[0], 4, 4, Array(), o); };
  const Array cot = random_normal({2, 10, 4, 8}, 65);
  std::map<std::string, int> calls;
  prim::OpObserver previous = prim::set_op_observer([&](const prim::OpEvent& e) { ++calls[e.primitive.name()]; });
  const auto [fused, grads] = vjp(packed, in, cot);
  prim::set_op_observer(previous);
  EXPECT_EQ(calls["flash_attention"], 1);
  EXPECT_EQ(calls["slice"] + calls["concatenate"] + calls["pad_into"] + calls["transpose"], 0);
  EXPECT_EQ(max_abs_diff(fused, sliced(in)), 0.0);
  EXPECT_EQ(max_abs_diff(grads[0], vjp(sliced, in, cot).second[0]), 0.0);
  set_attention_kernel(AttentionKernel::composed);
  const auto [composed, composed_grads] = vjp(packed, in, cot);
  set_attention_kernel(AttentionKernel::automatic);
  expect_close(composed, fused, {1e-6, 1e-5}, "attention_packed, composed");
  expect_close(composed_grads[0], grads[0], {1e-6, 1e-5}, "attention_packed, composed gradient");
  expect_error([] { flash_attention_packed(Array::zeros({1, 4, 5, 8}), 2, 2, 1.0, true); },
               {"[flash_attention]", "(B, T, H + 2·Hkv, D)", "(1, 4, 5, 8)"});
  expect_error([] { attention_packed(Array::zeros({1, 4, 7, 8}), 3, 2); }, {"[attention]", "Hkv = 2", "(1, 4, 7, 8)"});
}

// The CPU kernel at sizes the test above does not reach: two blocks of query rows (67: a
// ragged last block), head dims 12, 40 and 64, bottom-right causal with Tq < Tk; and the
// default (automatic) path of scaled_dot_product_attention, which is fused on the CPU.
TEST(AttentionOracle, FlashAttentionKernelShapesEqualTheComposedForm) {
  const RngKey key{11, 5};
  struct Case {
    int64_t tq, tk, d;
  };
  for (const Case& c : {Case{37, 37, 12}, Case{30, 45, 40}, Case{67, 67, 64}}) {
    const std::vector<Array> in = {random_normal({2, 2, c.tq, c.d}, 1), random_normal({2, 2, c.tk, c.d}, 2),
                                   random_normal({2, 2, c.tk, c.d}, 3)};
    AttentionOptions o;
    o.causal = true, o.dropout_rate = 0.2, o.dropout_key = key, o.train = true;
    auto with = [o](AttentionKernel kernel) {
      return [o, kernel](const std::vector<Array>& x) {
        set_attention_kernel(kernel);
        Array y = scaled_dot_product_attention(x[0], x[1], x[2], Array(), o);
        set_attention_kernel(AttentionKernel::automatic);
        return y;
      };
    };
    const std::string label = "T" + std::to_string(c.tq) + "x" + std::to_string(c.tk) + " D" + std::to_string(c.d);
    const Tolerance tol{1e-5, 1e-5, 1e-6};
    expect_close(with(AttentionKernel::automatic)(in), with(AttentionKernel::composed)(in), tol, label + " forward");
    const Array cot = random_normal({2, 2, c.tq, c.d}, 4);
    const auto gf = vjp(with(AttentionKernel::automatic), in, cot).second;
    const auto gc = vjp(with(AttentionKernel::composed), in, cot).second;
    for (int i = 0; i < 3; ++i) expect_close(gf[size_t(i)], gc[size_t(i)], tol, label + " d" + "qkv"[i]);
  }
  // The encoder form (BERT): not causal, keys padded per batch, one batch row's keys all
  // masked (its queries attend uniformly in both forms).
  {
    const int64_t tq = 21, d = 24;
    const std::vector<Array> in = {random_normal({3, 2, tq, d}, 5), random_normal({3, 2, tq, d}, 6),
                                   random_normal({3, 2, tq, d}, 7)};
    std::vector<float> keep(size_t(3 * tq), 1.0f);
    for (int64_t j = 15; j < tq; ++j) keep[size_t(j)] = 0.0f;           // batch 0: 15 real tokens
    for (int64_t j = 0; j < tq; ++j) keep[size_t(2 * tq + j)] = 0.0f;   // batch 2: none
    const Array mask = cast(Array::from_vector(keep, {3, 1, 1, tq}), DType::boolean);
    AttentionOptions o;
    o.causal = false, o.dropout_rate = 0.1, o.dropout_key = key, o.train = true;
    auto with = [o, mask](AttentionKernel kernel) {
      return [o, mask, kernel](const std::vector<Array>& x) {
        set_attention_kernel(kernel);
        Array y = scaled_dot_product_attention(x[0], x[1], x[2], mask, o);
        set_attention_kernel(AttentionKernel::automatic);
        return y;
      };
    };
    const Tolerance tol{1e-5, 1e-5, 1e-6};
    expect_close(with(AttentionKernel::automatic)(in), with(AttentionKernel::composed)(in), tol, "padded keys forward");
    const Array cot = random_normal({3, 2, tq, d}, 8);
    const auto gf = vjp(with(AttentionKernel::automatic), in, cot).second;
    const auto gc = vjp(with(AttentionKernel::composed), in, cot).second;
    for (int i = 0; i < 3; ++i) expect_close(gf[size_t(i)], gc[size_t(i)], tol, std::string("padded keys d") + "qkv"[i]);
    // Second order through the recorded (composed) backward of the fused primitive.
    auto grad_sum = [&](AttentionKernel kernel) {
      return [&, kernel](const std::vector<Array>& x) {
        auto [value, g] = vjp(with(kernel), x, cot);
        return sum(mul(g[0], g[0]));
      };
    };
    const auto hf = vjp(grad_sum(AttentionKernel::automatic), in, scalar_like(in[0], 1.0).view_as_shape({})).second;
    const auto hc = vjp(grad_sum(AttentionKernel::composed), in, scalar_like(in[0], 1.0).view_as_shape({})).second;
    for (int i = 0; i < 3; ++i)
      expect_close(hf[size_t(i)], hc[size_t(i)], {1e-4, 1e-4, 1e-6}, std::string("padded keys second order d") + "qkv"[i]);
  }
  // The automatic choice on the CPU is the fused primitive (else the comparison is empty).
  int fused_calls = 0;
  auto previous = prim::set_op_observer([&](const prim::OpEvent& e) {
    fused_calls += std::string(e.primitive.name()) == "flash_attention";
  });
  AttentionOptions o;
  o.causal = true;
  Array x = random_normal({1, 2, 8, 16}, 9);
  scaled_dot_product_attention(x, x, x, Array(), o);
  o.causal = false;  // an encoder with a key-padding mask
  scaled_dot_product_attention(x, x, x, cast(Array::from_vector(std::vector<float>(8, 1.0f), {1, 1, 1, 8}), DType::boolean),
                               o);
  prim::set_op_observer(previous);
  EXPECT_EQ(fused_calls, 2);
}

// The CPU kernel with bf16 operands (bf16 arrays, or f32 arrays under a bf16 matmul
// precision: blocks of 64 query rows through oneDNN's bf16 GEMMs, native, or f32 GEMMs of the
// rounded values on the _avx2 registration) against itself with f32 operands on the same
// bf16-exact inputs, at
// sizes the tests above do not reach: several blocks with a ragged last one, causal with
// Tq < Tk, grouped heads, heads-inner arrays, a key-padding mask with one batch fully masked,
// dropout 0.1 on every case, head dims 64, 40 and 32; the forward, the log-sum-exps and the
// three gradients.
TEST(AttentionOracle, Bf16OperandKernelEqualsTheF32Kernel) {
  struct Case {
    int64_t b, h, group, tq, tk, d;
    bool causal, masked, heads_inner;
  };
  for (const Case& c : {Case{2, 4, 2, 150, 150, 64, true, false, false}, Case{1, 2, 1, 70, 133, 40, true, false, true},
                        Case{3, 2, 1, 100, 100, 32, false, true, false}}) {
    const int64_t hkv = c.h / c.group;
    const Shape qs = c.heads_inner ? Shape{c.b, c.tq, c.h, c.d} : Shape{c.b * c.h, c.tq, c.d};
    const Shape ks = c.heads_inner ? Shape{c.b, c.tk, hkv, c.d} : Shape{c.b * hkv, c.tk, c.d};
    // Values bf16 holds exactly, so both kernels see the same inputs.
    auto draw = [](const Shape& shape, uint64_t i) { return cast(cast(random_normal(shape, i), DType::bf16), DType::f32); };
    const Array q = draw(qs, 1), k = draw(ks, 2), v = draw(ks, 3), g = draw(qs, 4);
    std::vector<uint8_t> mask(size_t(c.b * c.tk), 1);
    for (int64_t j = 60; j < c.tk; ++j) mask[size_t(j)] = 0;                         // batch 0: 60 keys
    for (int64_t j = 0; j < c.tk; ++j) mask[size_t((c.b - 1) * c.tk + j)] = 0;        // the last: none
    kernels::FlashAttentionShape s;
    s.batch_heads = c.b * c.h, s.tq = c.tq, s.tk = c.tk, s.d = c.d, s.group = c.group;
    s.scale = float(1.0 / std::sqrt(double(c.d))), s.causal = c.causal, s.dropout_rate = 0.1;
    s.dropout_key = RngKey{13, 4}, s.heads = c.h, s.heads_inner = c.heads_inner;
    if (c.masked) s.key_mask = reinterpret_cast<const bool*>(mask.data()), s.mask_batches = c.b;
    struct Result {
      Array out, lse, dq, dk, dv;
    };
    auto run = [&](DType dtype, kernels::FlashAttentionShape::Operands operands) {
      kernels::FlashAttentionShape sh = s;
      sh.operands = operands;
      const Array qd = cast(q, dtype), kd = cast(k, dtype), vd = cast(v, dtype), gd = cast(g, dtype);
      Result r{Array::zeros(qs, dtype), Array::zeros({s.batch_heads, c.tq}), Array::zeros(qs, dtype),
               Array::zeros(ks, dtype), Array::zeros(ks, dtype)};
      cpu::flash_attention_forward(qd, kd, vd, sh, r.out, r.lse);
      cpu::flash_attention_backward(qd, kd, vd, r.out, r.lse, gd, sh, r.dq, r.dk, r.dv);
      return r;
    };
    using Operands = kernels::FlashAttentionShape::Operands;
    const Result ref = run(DType::f32, Operands::f32);
    const std::string name = "T" + std::to_string(c.tq) + "x" + std::to_string(c.tk) + " D" + std::to_string(c.d) +
                             (c.causal ? " causal" : " masked") + (c.heads_inner ? " heads-inner" : "") +
                             (c.group > 1 ? " grouped" : "");
    for (const auto& [dtype, operands] : {std::pair{DType::bf16, Operands::f32}, std::pair{DType::f32, Operands::bf16}}) {
      const Result r = run(dtype, operands);
      const std::string label = name + (dtype == DType::bf16 ? ", bf16 arrays" : ", f32 arrays with bf16 operands");
      const Tolerance tol = default_tolerance(DType::bf16);
      expect_close(cast(r.out, DType::f32), ref.out, tol, label + " forward");
      expect_close(r.lse, ref.lse, {1e-5, 1e-5, 1e-5}, label + " log-sum-exps");
      expect_close(cast(r.dq, DType::f32), ref.dq, tol, label + " dq");
      expect_close(cast(r.dk, DType::f32), ref.dk, tol, label + " dk");
      expect_close(cast(r.dv, DType::f32), ref.dv, tol, label + " dv");
    }
  }
}

TEST(AttentionOracle, FullyMaskedRowIsUniformNotNaN) {
  Array q = random_normal({1, 1, 2, 4}, 1), k = random_normal({1, 1, 3, 4}, 2), v = random_normal({1, 1, 3, 4}, 3);
  Array none = Array::zeros({1, 1, 1, 3}, DType::boolean);
  Array out = scaled_dot_product_attention(q, k, v, none);
  Array mean_v = mean(v, {2}, true);
  expect_close(out, broadcast_to(mean_v, out.shape()), {1e-6, 1e-6}, "fully masked row");
}

TEST(AttentionOracle, RotaryHalfSplitAndInterleaved) {
  const std::string half = R"(
x, pos = x0, x1
d = x.shape[-1]
inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
ang = pos.float()[..., None] * inv
cos, sin = ang.cos(), ang.sin()
if pos.dim() == 2:
    cos, sin = cos[:, None], sin[:, None]
cos = torch.cat([cos, cos], -1).to(x.dtype); sin = torch.cat([sin, sin], -1).to(x.dtype)
rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
out = x * cos + rot * sin
)";
  const std::string inter = R"(
x, pos = x0, x1
d = x.shape[-1]
inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
ang = pos.float()[..., None] * inv
cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
if pos.dim() == 2:
    cos, sin = cos[:, None], sin[:, None]
x0_, x1_ = x[..., 0::2], x[..., 1::2]
out = torch.stack([x0_ * cos - x1_ * sin, x0_ * sin + x1_ * cos], -1).flatten(-2)
)";
  Array x = random_normal({2, 3, 5, 8}, 7);
  Array pos = Array::from_vector(std::vector<int64_t>{3, 4, 5, 6, 7}, {5});
  Array pos2 = Array::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0, 0, 1, 2, 3}, {2, 5});
  for (bool interleaved : {false, true})
    for (const Array& p : {pos, pos2}) {
      auto fn = [&](const std::vector<Array>& in) { return rotary_embedding(in[0], in[1], 10000.0, interleaved); };
      std::string label = std::string("rotary ") + (interleaved ? "interleaved" : "half") + " pos" + p.shape().str();
      check_against_torch(label, fn, interleaved ? inter : half, {x, p});
      check_finite_differences(label, fn, {x, p});
    }
  EXPECT_THROW(rotary_embedding(random_normal({2, 5, 7}, 1), pos), Error);  // odd head dim
  EXPECT_THROW(rotary_embedding(x, Array::from_vector(std::vector<int64_t>{1, 2}, {2})), Error);
}

// The fused rotation (one rotary_embedding op each way) equals the composed ops bit for bit,
// forward and gradient, in every layout it takes — (B, H, T, D) and heads-inner (B, T, H, D),
// positions (T,) and (B, T), half-split and interleaved pairs — in f32 and bf16; second order
// within 1e-6; and the composed reference's nine ops are gone from both passes.
// How many values of a and b differ in their bits (a zero's sign included), read as f32.
size_t bits_differ(const Array& a, const Array& b) {
  const std::vector<float> x = a.to_floats(), y = b.to_floats();
  size_t n = x.size() == y.size() ? 0 : std::max(x.size(), y.size());
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) n += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
  return n;
}

TEST(AttentionOracle, FusedRotaryEqualsTheComposedForm) {
  struct Restore {
    bool previous = fused_layers();
    ~Restore() { set_fused_layers(previous); }
  } restore;
  const Array pos = Array::from_vector(std::vector<int64_t>{3, 4, 5, 6, 7}, {5});
  const Array pos2 = Array::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 9, 0, 1, 2, 3}, {2, 5});
  for (bool heads_inner : {false, true})
    for (bool interleaved : {false, true})
      for (const Array& p : {pos, pos2})
        for (DType dtype : {DType::f32, DType::bf16}) {
          const Shape shape = heads_inner ? Shape{2, 5, 3, 12} : Shape{2, 3, 5, 12};
          const std::vector<Array> in = {cast(random_normal(shape, 71), dtype)};
          auto with = [&](bool fused) {
            return [&, fused](const std::vector<Array>& x) {
              set_fused_layers(fused);
              Array y = rotary_embedding(x[0], p, 500000.0, interleaved, heads_inner);
              set_fused_layers(true);
              return y;
            };
          };
          const std::string label = std::string("rotary ") + (heads_inner ? "heads inner " : "") +
                                    (interleaved ? "interleaved" : "half") + " pos" + p.shape().str() + " " +
                                    dtype_name(dtype);
          // Zero cotangents in places: the backward's zeros keep the composed form's sign.
          const Array draw = random_normal(shape, 74);
          const Array cot =
              cast(where(gt(draw, scalar_like(draw, 0.5)), random_normal(shape, 72), zeros_like(draw)), dtype);
          std::map<std::string, int> calls;
          prim::OpObserver previous =
              prim::set_op_observer([&](const prim::OpEvent& e) { ++calls[e.primitive.name()]; });
          const auto [fused, fused_grads] = vjp(with(true), in, cot);
          prim::set_op_observer(previous);
          EXPECT_EQ(calls["rotary_embedding"], 2) << label;  // forward and backward
          EXPECT_EQ(calls["slice"] + calls["concatenate"] + calls["stack"] + calls["sub"], 0) << label;
          const auto [composed, composed_grads] = vjp(with(false), in, cot);
          EXPECT_EQ(bits_differ(fused, composed), 0u) << label << " forward";
          EXPECT_EQ(bits_differ(fused_grads[0], composed_grads[0]), 0u) << label << " gradient";
          if (dtype != DType::f32 || interleaved || p.ndim() != 1) continue;
          auto second = [&](bool f) {
            return [&, f](const std::vector<Array>& x) { return vjp(with(f), x, cot).second[0]; };
          };
          const Array cot2 = random_normal(shape, 73);
          expect_close(vjp(second(true), in, cot2).second[0], vjp(second(false), in, cot2).second[0],
                       {1e-6, 1e-6, 1e-6}, label + " second order");
        }
}

TEST(AttentionOracle, TransformerBlockForwardAndBackward) {
  // A GPT-2 style pre-LN block: LN -> causal MHA -> residual -> LN -> GELU MLP -> residual.
  const int64_t b = 2, t = 6, c = 16, h = 4;
  Params p{{"ln1.w", add(random_normal({c}, 1, DType::f32, 0.1), 1.0)}, {"ln1.b", random_normal({c}, 2, DType::f32, 0.1)},
           {"qkv.w", random_normal({c, 3 * c}, 3, DType::f32, 0.2)}, {"qkv.b", random_normal({3 * c}, 4, DType::f32, 0.1)},
           {"proj.w", random_normal({c, c}, 5, DType::f32, 0.2)},    {"proj.b", random_normal({c}, 6, DType::f32, 0.1)},
           {"ln2.w", add(random_normal({c}, 7, DType::f32, 0.1), 1.0)}, {"ln2.b", random_normal({c}, 8, DType::f32, 0.1)},
           {"fc.w", random_normal({c, 4 * c}, 9, DType::f32, 0.2)},  {"fc.b", random_normal({4 * c}, 10, DType::f32, 0.1)},
           {"out.w", random_normal({4 * c, c}, 11, DType::f32, 0.2)}, {"out.b", random_normal({c}, 12, DType::f32, 0.1)}};
  Array x = random_normal({b, t, c}, 13);
  Array target = random_normal({b, t, c}, 14);
  auto block = [&](const Params& q) {
    Array a = layer_norm(x, q["ln1.w"], q["ln1.b"]);
    Array qkv = add(matmul(a, q["qkv.w"]), q["qkv.b"]);
    auto heads = [&](int64_t i) { return swap_axes(reshape(slice(qkv, -1, i * c, (i + 1) * c), {b, t, h, c / h}), 1, 2); };
    Array y = scaled_dot_product_attention(heads(0), heads(1), heads(2), Array(), {.causal = true});
    y = reshape(swap_axes(y, 1, 2), {b, t, c});
    Array r = add(x, add(matmul(y, q["proj.w"]), q["proj.b"]));
    Array m = gelu(add(matmul(layer_norm(r, q["ln2.w"], q["ln2.b"]), q["fc.w"]), q["fc.b"]));
    Array out = add(r, add(matmul(m, q["out.w"]), q["out.b"]));
    return mean(square(sub(out, target)));
  };
  auto [loss, grads] = value_and_grad(block)(p);

  std::string code = std::string(kTorchAttention) + R"(
(ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, outw, outb, x, target) = xs
b, t, c, h = 2, 6, 16, 4
a = F.layer_norm(x, (c,), ln1w, ln1b)
qkv = a @ qkvw + qkvb
def heads(i): return qkv[..., i * c:(i + 1) * c].reshape(b, t, h, c // h).transpose(1, 2)
y = attention(heads(0), heads(1), heads(2), None, True).transpose(1, 2).reshape(b, t, c)
r = x + (y @ projw + projb)
m = F.gelu(F.layer_norm(r, (c,), ln2w, ln2b) @ fcw + fcb)
o = r + (m @ outw + outb)
out = ((o - target) ** 2).mean()
)";
  std::vector<OracleTensor> ins;
  for (const auto& [path, value] : p) ins.push_back(to_oracle(value));
  ins.push_back(to_oracle(x));
  ins.push_back(to_oracle(target));
  OracleResult ref = TorchOracle::instance().run(code, ins, {OracleTensor{{}, "float32", {1.0}}});
  expect_close(loss, ref.outputs[0], {1e-6, 1e-5}, "block loss");
  size_t i = 0;
  for (const auto& [path, value] : p) expect_close(grads[path], *ref.grads[i++], {1e-6, 1e-4}, "block d/d" + path);
}

TEST(AttentionErrors, ShapesAreNamed) {
  Array q = Array::zeros({1, 3, 4, 8}), k = Array::zeros({1, 2, 4, 8});
  try {
    scaled_dot_product_attention(q, k, k);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[attention]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(scaled_dot_product_attention(Array::zeros({1, 2, 4, 8}), Array::zeros({1, 2, 4, 6}),
                                            Array::zeros({1, 2, 4, 6})),
               Error);
  EXPECT_THROW(scaled_dot_product_attention(q, q, q, Array::zeros({1, 1, 4, 4})), Error);  // mask not bool
}

}  // namespace
}  // namespace mt::testing
