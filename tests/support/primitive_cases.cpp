#include "tests/support/primitive_cases.h"

#include <cmath>

#include "meshtrain/ops/linear.h"
#include "meshtrain/ops/optimizer_ops.h"
#include "meshtrain/ops/paged_attention.h"

namespace mt::testing {

namespace {
Array rn(const Shape& s, uint64_t seed) { return random_normal(s, seed); }
Array ru(const Shape& s, uint64_t seed, double lo, double hi) { return random_uniform(s, seed, lo, hi); }
Array mask(const Shape& s, uint64_t seed) { return gt(rn(s, seed), zeros_like(rn(s, seed))); }
}  // namespace

std::vector<PrimitiveCase> primitive_cases() {
  std::vector<PrimitiveCase> c;
  auto unary = [&](const char* name, Array (*f)(const Array&), const char* torch, double lo, double hi) {
    c.push_back({name, {ru({4, 7}, 10, lo, hi)}, [f](const std::vector<Array>& in) { return f(in[0]); }, torch});
  };
  unary("neg", neg, "out = -x0", -3, 3);
  unary("exp", exp, "out = torch.exp(x0)", -3, 3);
  unary("log", log, "out = torch.log(x0)", 0.2, 4);
  unary("sqrt", sqrt, "out = torch.sqrt(x0)", 0.2, 4);
  unary("rsqrt", rsqrt, "out = torch.rsqrt(x0)", 0.2, 4);
  unary("tanh", tanh, "out = torch.tanh(x0)", -3, 3);
  unary("abs", abs, "out = torch.abs(x0)", 0.3, 3);    // away from the kink for finite differences
  unary("sign", sign, "out = torch.sign(x0)", 0.3, 3);
  unary("relu", relu, "out = torch.relu(x0)", 0.3, 3);
  unary("sigmoid", sigmoid, "out = torch.sigmoid(x0)", -4, 4);
  unary("silu", silu, "out = F.silu(x0)", -4, 4);
  unary("gelu", [](const Array& x) { return gelu(x, false); }, "out = F.gelu(x0)", -3, 3);
  unary("gelu_tanh", [](const Array& x) { return gelu(x, true); }, "out = F.gelu(x0, approximate='tanh')", -3, 3);
  unary("erf", erf, "out = torch.erf(x0)", -2, 2);
  unary("sin", sin, "out = torch.sin(x0)", -3, 3);
  unary("cos", cos, "out = torch.cos(x0)", -3, 3);
  unary("square", square, "out = torch.square(x0)", -3, 3);
  unary("reciprocal", reciprocal, "out = torch.reciprocal(x0)", 0.3, 3);
  c.push_back({"logical_not", {mask({4, 7}, 11)}, [](const std::vector<Array>& in) { return logical_not(in[0]); },
               "out = torch.logical_not(x0)", false});

  auto binary = [&](const char* name, Array (*f)(const Array&, const Array&), const char* torch, double lo, double hi,
                    bool grads = true) {
    c.push_back({name, {ru({4, 1, 5}, 20, lo, hi), ru({3, 5}, 21, lo, hi)},
                 [f](const std::vector<Array>& in) { return f(in[0], in[1]); }, torch, grads});
  };
  binary("add", add, "out = x0 + x1", -3, 3);
  binary("sub", sub, "out = x0 - x1", -3, 3);
  binary("mul", mul, "out = x0 * x1", -3, 3);
  binary("div", div, "out = x0 / x1", 0.5, 3);
  binary("pow", pow, "out = torch.pow(x0, x1)", 0.5, 2);
  binary("maximum", maximum, "out = torch.maximum(x0, x1)", -3, 3);
  binary("minimum", minimum, "out = torch.minimum(x0, x1)", -3, 3);
  // Comparisons on a few integer-valued floats, so that ties occur.
  auto compare = [&](const char* name, Array (*f)(const Array&, const Array&), const char* torch) {
    c.push_back({name, {cast(random_ints({4, 1, 5}, 22, 0, 3), DType::f32), cast(random_ints({3, 5}, 23, 0, 3), DType::f32)},
                 [f](const std::vector<Array>& in) { return f(in[0], in[1]); }, torch, false});
  };
  compare("eq", eq, "out = x0 == x1");
  compare("ne", ne, "out = x0 != x1");
  compare("lt", lt, "out = x0 < x1");
  compare("le", le, "out = x0 <= x1");
  compare("gt", gt, "out = x0 > x1");
  compare("ge", ge, "out = x0 >= x1");
  c.push_back({"logical_and", {mask({4, 1, 5}, 24), mask({3, 5}, 25)},
               [](const std::vector<Array>& in) { return logical_and(in[0], in[1]); }, "out = x0 & x1", false});
  c.push_back({"logical_or", {mask({4, 1, 5}, 26), mask({3, 5}, 27)},
               [](const std::vector<Array>& in) { return logical_or(in[0], in[1]); }, "out = x0 | x1", false});
  c.push_back({"where", {mask({4, 5}, 28), rn({4, 5}, 29), rn({1, 5}, 30)},
               [](const std::vector<Array>& in) { return where(in[0], in[1], in[2]); }, "out = torch.where(x0, x1, x2)"});
  c.push_back({"cast", {rn({4, 5}, 31)}, [](const std::vector<Array>& in) { return cast(cast(in[0], DType::bf16), DType::f32); },
               "out = x0.to(torch.bfloat16).float()", true, {1e-6, 1e-6}});
  c.push_back({"precast", {rn({4, 5}, 33)},
               [](const std::vector<Array>& in) {
                 // Its cast made apart (here an f32 copy, so finite differences see a smooth
                 // function; the bf16 path is tests/oracle/mixed_precision_oracle_test).
                 return precast(in[0], add(stop_gradient(in[0]), 0.0));
               },
               "out = x0.clone()"});
  c.push_back({"fill_like", {rn({4, 5}, 32)}, [](const std::vector<Array>& in) { return ones_like(in[0]); },
               "out = torch.ones_like(x0)", false});

  c.push_back({"reshape", {rn({4, 3, 5}, 40)}, [](const std::vector<Array>& in) { return reshape(in[0], {4, 15}); },
               "out = x0.reshape(4, 15)"});
  c.push_back({"transpose", {rn({4, 3, 5}, 41)}, [](const std::vector<Array>& in) { return transpose(in[0], {2, 0, 1}); },
               "out = x0.permute(2, 0, 1)"});
  c.push_back({"slice", {rn({4, 5, 3}, 42)}, [](const std::vector<Array>& in) { return slice(in[0], 1, 1, 4); },
               "out = x0[:, 1:4]"});
  c.push_back({"pad_into", {rn({4, 2, 3}, 43)},
               [](const std::vector<Array>& in) { return pad_into(in[0], Shape{4, 5, 3}, 1, 1); },
               "out = F.pad(x0, (0, 0, 1, 2))"});
  c.push_back({"concatenate", {rn({4, 2, 3}, 44), rn({4, 4, 3}, 45)},
               [](const std::vector<Array>& in) { return concatenate({in[0], in[1]}, 1); }, "out = torch.cat([x0, x1], 1)"});
  c.push_back({"broadcast_to", {rn({4, 1}, 46)},
               [](const std::vector<Array>& in) { return broadcast_to(in[0], Shape{2, 4, 3}); }, "out = x0.expand(2, 4, 3)"});

  c.push_back({"sum", {rn({3, 4, 5}, 50)}, [](const std::vector<Array>& in) { return sum(in[0], {0, 2}); },
               "out = x0.sum(dim=(0, 2))"});
  c.push_back({"max", {rn({3, 4, 5}, 51)}, [](const std::vector<Array>& in) { return max(in[0], {1}); },
               "out = x0.amax(dim=1)"});
  c.push_back({"min", {rn({3, 4, 5}, 52)}, [](const std::vector<Array>& in) { return min(in[0], {0, 2}, true); },
               "out = x0.amin(dim=(0, 2), keepdim=True)"});
  c.push_back({"argmax", {rn({3, 4, 5}, 53)}, [](const std::vector<Array>& in) { return argmax(in[0], 1); },
               "out = x0.argmax(dim=1)", false});

  c.push_back({"softmax", {rn({4, 6}, 60)}, [](const std::vector<Array>& in) { return softmax(in[0], -1); },
               "out = torch.softmax(x0, -1)"});
  c.push_back({"log_softmax", {rn({4, 6}, 61)}, [](const std::vector<Array>& in) { return log_softmax(in[0], 0); },
               "out = torch.log_softmax(x0, 0)"});
  c.push_back({"layer_norm", {rn({4, 8}, 62), rn({8}, 63), rn({8}, 64)},
               [](const std::vector<Array>& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
               "out = F.layer_norm(x0, (8,), x1, x2, 1e-5)"});
  c.push_back({"rms_norm", {rn({4, 8}, 65), rn({8}, 66)},
               [](const std::vector<Array>& in) { return rms_norm(in[0], in[1], 1e-6); },
               "out = x0 * torch.rsqrt(x0.pow(2).mean(-1, keepdim=True) + 1e-6) * x1"});
  c.push_back({"matmul", {rn({4, 3, 4}, 70), rn({5, 4}, 71)},
               [](const std::vector<Array>& in) { return matmul(in[0], in[1], false, true); }, "out = x0 @ x1.T"});

  c.push_back({"take", {rn({8, 4}, 80), random_ints({4}, 81, 0, 8)},
               [](const std::vector<Array>& in) { return take(in[0], in[1], 0); }, "out = torch.index_select(x0, 0, x1)"});
  c.push_back({"scatter_add", {rn({4, 4}, 82), random_ints({4}, 83, 0, 6)},
               [](const std::vector<Array>& in) { return scatter_add({6, 4}, in[1], in[0], 0); },
               "out = torch.zeros(6, 4, dtype=x0.dtype).index_add(0, x1, x0)"});
  c.push_back({"take_along_axis", {rn({4, 6}, 84), random_ints({4, 3}, 85, 0, 6)},
               [](const std::vector<Array>& in) { return take_along_axis(in[0], in[1], 1); },
               "out = torch.gather(x0, 1, x1)"});
  c.push_back({"scatter_add_along_axis", {rn({4, 3}, 86), random_ints({4, 3}, 87, 0, 6)},
               [](const std::vector<Array>& in) { return scatter_add_along_axis({4, 6}, in[1], in[0], 1); },
               "out = torch.zeros(4, 6, dtype=x0.dtype).scatter_add(1, x1, x0)"});
  c.push_back({"embedding", {rn({12, 4}, 88), random_ints({4, 3}, 89, 0, 12)},
               [](const std::vector<Array>& in) { return embedding(in[0], in[1]); }, "out = F.embedding(x1, x0)"});
  c.push_back({"one_hot", {random_ints({4, 3}, 90, 0, 5)},
               [](const std::vector<Array>& in) { return one_hot(in[0], 5, DType::f32); },
               "out = F.one_hot(x0, 5).float()", false});
  c.push_back({"top_k", {rn({4, 7}, 91)}, [](const std::vector<Array>& in) { return top_k(in[0], 3, -1).second; },
               "out = torch.topk(x0, 3, -1).indices", false});
  // The mask comes from meshtrain's counter-based stream; torch is handed the same mask.
  const RngKey key{7, 0};
  c.push_back({"dropout", {rn({4, 6}, 92), ne(dropout(Array::ones({4, 6}), 0.25, key, true), Array::zeros({4, 6}))},
               [key](const std::vector<Array>& in) { return dropout(in[0], 0.25, key, true); },
               "out = x0 * x1 / 0.75"});
  // The fused forms: the linear epilogue, the residual add of a dropped branch, and the
  // post-norm residual step (torch is handed the dropout mask, as above).
  c.push_back({"bias_activation", {rn({4, 3, 5}, 120), rn({5}, 121)},
               [](const std::vector<Array>& in) { return bias_activation(in[0], in[1], FusedActivation::gelu_tanh); },
               "out = F.gelu(x0 + x1, approximate='tanh')"});
  c.push_back({"bias_activation", {rn({6, 7}, 122), rn({7}, 123)},
               [](const std::vector<Array>& in) { return bias_activation(in[0], in[1], FusedActivation::gelu); },
               "out = F.gelu(x0 + x1)"});
  // A linear layer with its bias in the GEMM's epilogue: nn.Linear's layout over folded rows,
  // and Conv1D's [in, out] on a 2-D input.
  c.push_back({"linear_bias", {rn({2, 3, 5}, 130), rn({7, 5}, 131), rn({7}, 132)},
               [](const std::vector<Array>& in) { return linear_bias(in[0], in[1], in[2], true); },
               "out = F.linear(x0, x1, x2)"});
  c.push_back({"linear_bias", {rn({6, 5}, 133), rn({5, 9}, 134), rn({9}, 135)},
               [](const std::vector<Array>& in) { return linear_bias(in[0], in[1], in[2], false); },
               "out = x0 @ x1 + x2"});
  const Array keep46 = ne(dropout(Array::ones({4, 6}), 0.25, key, true), Array::zeros({4, 6}));
  c.push_back({"add_dropout", {rn({4, 6}, 124), rn({4, 6}, 125), keep46},
               [key](const std::vector<Array>& in) { return add_dropout(in[0], in[1], 0.25, key, true); },
               "out = x0 + x1 * x2 / 0.75"});
  // (4, 8): the sharded runs split the rows, so each rank draws its block's mask.
  const Array keep48 = ne(dropout(Array::ones({4, 8}), 0.25, key, true), Array::zeros({4, 8}));
  c.push_back({"add_dropout_layer_norm", {rn({4, 8}, 126), rn({4, 8}, 127), rn({8}, 128), rn({8}, 129), keep48},
               [key](const std::vector<Array>& in) {
                 return add_dropout_layer_norm(in[0], in[1], in[2], in[3], 1e-5, 0.25, key, true);
               },
               "out = F.layer_norm(x0 + x1 * x4 / 0.75, (8,), x2, x3, 1e-5)"});
  c.push_back({"add_dropout_rms_norm", {rn({4, 8}, 130), rn({4, 8}, 131), rn({8}, 132), keep48},
               [key](const std::vector<Array>& in) { return add_dropout_rms_norm(in[0], in[1], in[2], 1e-6, 0.25, key, true); },
               "s = x0 + x1 * x3 / 0.75\nout = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * x2"});
  // A key whose last fold (the Trainer's step number) is read from memory on the inputs'
  // device: the same mask as the key with that value folded in on the host.
  auto step_folded = [key](const Array& on) {
    return key.folding_last(Array::scalar(5, DType::i64, on.device()));
  };
  const Array keep46_step5 = ne(dropout(Array::ones({4, 6}), 0.25, key.fold_in(5), true), Array::zeros({4, 6}));
  c.push_back({"dropout", {rn({4, 6}, 133), keep46_step5},
               [step_folded](const std::vector<Array>& in) { return dropout(in[0], 0.25, step_folded(in[0]), true); },
               "out = x0 * x1 / 0.75"});
  const Array keep48_step5 = ne(dropout(Array::ones({4, 8}), 0.25, key.fold_in(5), true), Array::zeros({4, 8}));
  c.push_back({"add_dropout_layer_norm", {rn({4, 8}, 134), rn({4, 8}, 135), rn({8}, 136), rn({8}, 137), keep48_step5},
               [step_folded](const std::vector<Array>& in) {
                 return add_dropout_layer_norm(in[0], in[1], in[2], in[3], 1e-5, 0.25, step_folded(in[0]), true);
               },
               "out = F.layer_norm(x0 + x1 * x4 / 0.75, (8,), x2, x3, 1e-5)"});
  c.push_back({"cross_entropy", {rn({8, 7}, 93), Array::from_vector(std::vector<int64_t>{0, 6, -100, 3, 2, 6, 1, 5}, {8})},
               [](const std::vector<Array>& in) { return cross_entropy(in[0], in[1], -100, 0.1); },
               "out = F.cross_entropy(x0, x1, ignore_index=-100, label_smoothing=0.1)"});
  // The head and its loss in chunks of 3 rows (the last one of 2).
  c.push_back({"linear_cross_entropy",
               {rn({8, 5}, 138), rn({7, 5}, 139), Array::from_vector(std::vector<int64_t>{0, 6, -100, 3, 2, 6, 1, 5}, {8})},
               [](const std::vector<Array>& in) {
                 return linear_cross_entropy(in[0], in[1], in[2], -100, 0.1, Reduction::mean, 21);
               },
               "out = F.cross_entropy(x0 @ x1.T, x2, ignore_index=-100, label_smoothing=0.1)"});
  // With a bias on the logits (BART's final_logits_bias), its gradient the rows' sum.
  c.push_back({"linear_cross_entropy",
               {rn({8, 5}, 148), rn({7, 5}, 149), Array::from_vector(std::vector<int64_t>{0, 6, -100, 3, 2, 6, 1, 5}, {8}),
                rn({7}, 150)},
               [](const std::vector<Array>& in) {
                 return linear_cross_entropy(in[0], in[1], in[2], -100, 0.0, Reduction::mean, 21, in[3]);
               },
               "out = F.cross_entropy(x0 @ x1.T + x3, x2, ignore_index=-100)"});
  c.push_back({"causal_softmax", {rn({4, 3, 5}, 94)},
               [](const std::vector<Array>& in) { return causal_softmax(in[0], 0.5); },
               "m = torch.ones(3, 5).tril(2).bool()\nout = torch.softmax((x0 * 0.5).masked_fill(~m, float('-inf')), -1)"});
  // Fused attention: (B, H, Tq, D) with fewer queries than keys (the bottom-right causal mask),
  // an odd head dim; and non-causal.
  c.push_back({"flash_attention", {rn({2, 3, 5, 7}, 95), rn({2, 3, 6, 7}, 96), rn({2, 3, 6, 7}, 98)},
               [](const std::vector<Array>& in) { return flash_attention(in[0], in[1], in[2], 0.4, true); },
               "m = torch.ones(5, 6).tril(1).bool()\n"
               "out = torch.softmax(((x0 @ x1.transpose(-1, -2)) * 0.4).masked_fill(~m, float('-inf')), -1) @ x2"});
  // Grouped-query heads: 4 query heads read 2 key/value heads.
  c.push_back({"flash_attention", {rn({2, 4, 5, 7}, 140), rn({2, 2, 6, 7}, 141), rn({2, 2, 6, 7}, 142)},
               [](const std::vector<Array>& in) { return flash_attention(in[0], in[1], in[2], 0.4, true); },
               "m = torch.ones(5, 6).tril(1).bool()\nk = x1.repeat_interleave(2, 1)\nv = x2.repeat_interleave(2, 1)\n"
               "out = torch.softmax(((x0 @ k.transpose(-1, -2)) * 0.4).masked_fill(~m, float('-inf')), -1) @ v"});
  // Heads inner: (B, T, H, D) arrays read and written in place, grouped heads (4 query, 2 kv).
  c.push_back({"flash_attention", {rn({2, 5, 4, 8}, 143), rn({2, 6, 2, 8}, 144), rn({2, 6, 2, 8}, 145)},
               [](const std::vector<Array>& in) { return flash_attention_heads_inner(in[0], in[1], in[2], 0.4, true); },
               "m = torch.ones(5, 6).tril(1).bool()\nq = x0.transpose(1, 2)\n"
               "k = x1.transpose(1, 2).repeat_interleave(2, 1)\nv = x2.transpose(1, 2).repeat_interleave(2, 1)\n"
               "out = (torch.softmax(((q @ k.transpose(-1, -2)) * 0.4).masked_fill(~m, float('-inf')), -1) @ v)"
               ".transpose(1, 2)"});
  // Packed: one (B, T, H + 2·Hkv, D) q | k | v projection read in place (2 query heads, 1 + 1
  // key/value heads), its gradient written packed.
  c.push_back({"flash_attention", {rn({2, 6, 4, 8}, 146)},
               [](const std::vector<Array>& in) { return flash_attention_packed(in[0], 2, 1, 0.4, true); },
               "m = torch.ones(6, 6).tril().bool()\nq = x0[:, :, :2].transpose(1, 2)\n"
               "k = x0[:, :, 2:3].transpose(1, 2).repeat_interleave(2, 1)\n"
               "v = x0[:, :, 3:4].transpose(1, 2).repeat_interleave(2, 1)\n"
               "out = (torch.softmax(((q @ k.transpose(-1, -2)) * 0.4).masked_fill(~m, float('-inf')), -1) @ v)"
               ".transpose(1, 2)"});
  c.push_back({"flash_attention", {rn({1, 2, 4, 3}, 99), rn({1, 2, 6, 3}, 100), rn({1, 2, 6, 3}, 101)},
               [](const std::vector<Array>& in) { return flash_attention(in[0], in[1], in[2], 0.7, false); },
               "out = torch.softmax((x0 @ x1.transpose(-1, -2)) * 0.7, -1) @ x2"});
  // Rotary embedding, (B, H, T, D) half-split pairs at positions 3..7 (the fused rotation).
  c.push_back({"rotary_embedding",
               {rn({2, 3, 5, 8}, 147), Array::from_vector(std::vector<int64_t>{3, 4, 5, 6, 7}, {5})},
               [](const std::vector<Array>& in) { return rotary_embedding(in[0], in[1]); },
               "inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8))\n"
               "ang = x1.float()[:, None] * inv\nc, s = ang.cos().to(x0.dtype), ang.sin().to(x0.dtype)\n"
               "a, b = x0[..., :4], x0[..., 4:]\nout = torch.cat([a * c - b * s, b * c + a * s], -1)"});
  // Paged KV cache: a pool of 3 blocks of 2 positions filled by one write (the blocks out of
  // order), read back whole; two rows written into scattered slots; two rows of grouped-query
  // decode attention reading their positions through a block table (row 0 ends mid-block).
  c.push_back({"kv_pool_like", {rn({1, 2, 6, 3}, 102)},
               [](const std::vector<Array>& in) {
                 return paged_kv_write(kv_pool_like(in[0], 3, 2), in[0], {4, 5, 0, 1, 2, 3});
               },
               "out = x0[0].reshape(2, 3, 2, 3).permute(1, 0, 2, 3)[[1, 2, 0]]", false});
  c.push_back({"paged_kv_write", {rn({2, 2, 3, 3}, 103)},
               [](const std::vector<Array>& in) {
                 return paged_kv_write(kv_pool_like(in[0], 3, 2), in[0], {5, 3, 1, 0, 2, 4});
               },
               "flat = x0.permute(1, 0, 2, 3).reshape(2, 6, 3)\n"
               "o = torch.empty_like(flat)\no[:, [5, 3, 1, 0, 2, 4]] = flat\n"
               "out = o.reshape(2, 3, 2, 3).permute(1, 0, 2, 3)",
               false});
  c.push_back({"paged_attention", {rn({2, 4, 1, 3}, 104), rn({3, 2, 2, 3}, 105), rn({3, 2, 2, 3}, 106)},
               [](const std::vector<Array>& in) {
                 PagedRows rows;
                 rows.block_table = {2, 0, 1, 2}, rows.max_blocks = 2, rows.lengths = {3, 2};
                 return paged_attention(in[0], in[1], in[2], rows, 0.6);
               },
               "def positions(p, blocks, n):\n"
               "    return torch.cat([p[b] for b in blocks], 1)[:, :n].repeat_interleave(2, 0)\n"
               "outs = []\n"
               "for i, (blocks, n) in enumerate([([2, 0], 3), ([1, 2], 2)]):\n"
               "    k, v = positions(x1, blocks, n), positions(x2, blocks, n)\n"
               "    outs.append(torch.softmax(x0[i] @ k.transpose(-1, -2) * 0.6, -1) @ v)\n"
               "out = torch.stack(outs)",
               false});
  // One AdamW step at step 3 (bias corrections), as torch.optim.AdamW computes it: m', v',
  // then the update (p decayed by lr·wd).
  AdamStep adam;
  adam.step_size = 1e-3 / (1 - std::pow(0.9, 3));
  adam.sqrt_bc2 = std::sqrt(1 - std::pow(0.999, 3));
  adam.decay = 1e-3 * 0.01;
  const Array v0 = mul(square(rn({5, 6}, 97)), 0.01);
  c.push_back({"adam_moments", {rn({5, 6}, 95), rn({5, 6}, 96), v0},
               [adam](const std::vector<Array>& in) { return adam_moments(in[0], in[1], in[2], adam); },
               "out = torch.stack([x1 * 0.9 + x0 * (1 - 0.9), x2 * 0.999 + x0 * x0 * (1 - 0.999)])", false});
  c.push_back({"adam_direction", {rn({5, 6}, 98), v0, rn({5, 6}, 99)},
               [adam](const std::vector<Array>& in) { return adam_direction(in[0], in[1], in[2], adam); },
               "import math\nbc1, bc2 = 1 - 0.9 ** 3, 1 - 0.999 ** 3\n"
               "out = -(x0 / (x1.sqrt() / math.sqrt(bc2) + 1e-8)) * (1e-3 / bc1) - x2 * (1e-3 * 0.01)", false});
  // The multi-tensor forms over three tensors of different shapes (flat results in order);
  // the middle one does not decay.
  const std::vector<Shape> shapes = {{5, 6}, {7}, {2, 3, 4}};
  std::vector<Array> moments_in, direction_in;
  for (int group = 0; group < 3; ++group)
    for (size_t j = 0; j < shapes.size(); ++j) {
      const uint64_t seed = 200 + 10 * uint64_t(group) + j;
      moments_in.push_back(group == 2 ? mul(square(rn(shapes[j], seed)), 0.01) : rn(shapes[j], seed));
      direction_in.push_back(group == 1 ? mul(square(rn(shapes[j], seed + 50)), 0.01) : rn(shapes[j], seed + 50));
    }
  c.push_back({"adam_moments_multi", moments_in,
               [adam](const std::vector<Array>& in) {
                 return adam_moments_multi({in[0], in[1], in[2]}, {in[3], in[4], in[5]}, {in[6], in[7], in[8]}, adam);
               },
               "g, m, v = [x0, x1, x2], [x3, x4, x5], [x6, x7, x8]\n"
               "out = torch.stack([torch.cat([(mi * 0.9 + gi * (1 - 0.9)).flatten() for gi, mi in zip(g, m)]),\n"
               "                   torch.cat([(vi * 0.999 + gi * gi * (1 - 0.999)).flatten() for gi, vi in zip(g, v)])])",
               false});
  c.push_back({"adam_direction_multi", direction_in,
               [adam](const std::vector<Array>& in) {
                 return adam_direction_multi({in[0], in[1], in[2]}, {in[3], in[4], in[5]}, {in[6], in[7], in[8]}, adam,
                                             {true, false, true}, adam_step_scalars(adam, in[0].device()));
               },
               "import math\nbc1, bc2 = 1 - 0.9 ** 3, 1 - 0.999 ** 3\n"
               "m, v, p, d = [x0, x1, x2], [x3, x4, x5], [x6, x7, x8], [1e-3 * 0.01, 0.0, 1e-3 * 0.01]\n"
               "out = torch.cat([(-(mi / (vi.sqrt() / math.sqrt(bc2) + 1e-8)) * (1e-3 / bc1) - pi * di).flatten()\n"
               "                 for mi, vi, pi, di in zip(m, v, p, d)])",
               false});
  // Gradient clipping's multi-tensor passes over three tensors of different shapes; the middle
  // one is longer than a tile (4096 elements), so a tensor's tiles are summed in order too.
  const std::vector<Shape> clip_shapes = {{5, 6}, {3, 2000}, {7}};
  std::vector<Array> clip_in;
  for (size_t j = 0; j < clip_shapes.size(); ++j) clip_in.push_back(rn(clip_shapes[j], 300 + j));
  c.push_back({"sum_squares_multi", clip_in,
               [](const std::vector<Array>& in) { return sum_of_squares_multi(in); },
               "out = x0.square().sum() + x1.square().sum() + x2.square().sum()"});
  c.push_back({"scale_multi", clip_in,
               [](const std::vector<Array>& in) {
                 const std::vector<Array> scaled =
                     scale_multi_into(in, Array::scalar(0.37, DType::f32, in[0].device()));
                 std::vector<Array> flat;
                 for (const Array& x : scaled) flat.push_back(reshape(x, {-1}));
                 return concatenate(flat, 0);
               },
               "out = torch.cat([x.flatten() * 0.37 for x in (x0, x1, x2)])", false});
  // Mixed precision's weight casts, all tensors in one call (one launch on a GPU).
  c.push_back({"cast_multi", clip_in,
               [](const std::vector<Array>& in) {
                 std::vector<Array> flat;
                 for (const Array& x : cast_multi(in, DType::bf16)) flat.push_back(reshape(cast(x, DType::f32), {-1}));
                 return concatenate(flat, 0);
               },
               "out = torch.cat([x.flatten().to(torch.bfloat16).float() for x in (x0, x1, x2)])", false});
  std::vector<Array> add_in = clip_in;
  for (size_t j = 0; j < clip_shapes.size(); ++j) add_in.push_back(rn(clip_shapes[j], 310 + j));
  c.push_back({"add_multi", add_in,
               [](const std::vector<Array>& in) {
                 const std::vector<Array> sums = add_multi_into({in[0], in[1], in[2]}, {in[3], in[4], in[5]});
                 std::vector<Array> flat;
                 for (const Array& x : sums) flat.push_back(reshape(x, {-1}));
                 return concatenate(flat, 0);
               },
               "out = torch.cat([(a + b).flatten() for a, b in ((x0, x3), (x1, x4), (x2, x5))])", false});
  return c;
}

const std::vector<DistributedOnly>& distributed_only_primitives() {
  static const std::vector<DistributedOnly> all = {
    {"vocab_parallel_statistics", "spmd_train_test: SpmdTrain.VocabParallelEmbeddingAndLossNeverGatherLogits"},
    {"vocab_parallel_slice_max", "spmd_train_test: SpmdTrain.VocabParallelEmbeddingAndLossNeverGatherLogits"},
  };
  return all;
}

std::optional<std::vector<Array>> bf16_inputs(const PrimitiveCase& c) {
  std::vector<Array> inputs = c.inputs;
  bool any = false;
  for (Array& x : inputs)
    if (x.defined() && x.dtype() == DType::f32) {
      x = cast(x, DType::bf16);
      any = true;
    }
  if (!any) return std::nullopt;
  return inputs;
}

bool f32_only_primitive(const std::string& name) {
  return name == "adam_moments" || name == "adam_direction" || name == "adam_moments_multi" ||
         name == "adam_direction_multi";
}

}  // namespace mt::testing
