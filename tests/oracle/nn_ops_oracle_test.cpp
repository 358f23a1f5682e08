// softmax, log_softmax, layer_norm and rms_norm against PyTorch: forward, first-order
// VJP (the fused backward kernels), second-order VJP (the composed VJPs used under nested
// differentiation), finite differences, f32/bf16/mixed precision, and error messages.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <sstream>

#include "tests/support/op_check.h"

namespace mt::testing {
namespace {


// ---- softmax / log_softmax ----------------------------------------------------------

struct SoftmaxCase {
  Shape shape;
  int axis;
};

// Odd sizes; axis last (contiguous rows) and not last (strided columns, incl. > one
// 256-column block); sizes large enough for the parallel paths.
const SoftmaxCase kSoftmaxCases[] = {
    {{3, 7}, -1}, {{3, 7}, 0},    {{4, 5, 3}, 1},   {{4, 5, 3}, 0},    {{4, 5, 3}, -1},
    {{13}, 0},    {{3, 5, 300}, 1}, {{64, 1001}, -1}, {{8, 50, 61}, 1}, {{2, 1, 9}, 1},
};

std::string softmax_torch(bool log, int axis, DType dt) {
  std::string f = log ? "torch.log_softmax" : "torch.softmax";
  // bf16 semantics: computed in f32, rounded once to bf16.
  if (dt == DType::f32) return "out = " + f + "(x0, dim=" + std::to_string(axis) + ")";
  return "out = " + f + "(x0.float(), dim=" + std::to_string(axis) + ").to(x0.dtype)";
}

TEST(SoftmaxOracle, AxesOddSizesF32AndBf16) {
  for (bool log : {false, true}) {
    for (const auto& c : kSoftmaxCases) {
      for (DType dt : {DType::f32, DType::bf16}) {
        Array x = random_normal(c.shape, 7, dt, 3.0);
        int axis = c.axis;
        auto fn = [log, axis](const std::vector<Array>& in) {
          return log ? log_softmax(in[0], axis) : softmax(in[0], axis);
        };
        std::string label = std::string(log ? "log_softmax " : "softmax ") + c.shape.str() + " axis " +
                            std::to_string(axis) + "/" + dtype_name(dt);
        check_against_torch(label, fn, softmax_torch(log, axis, dt), {x}, default_tolerance(dt));
      }
    }
  }
}

TEST(SoftmaxOracle, NativeTorchBf16) {
  // Also within bf16 tolerance of torch's own bf16 kernels.
  Array x = random_normal({6, 37}, 8, DType::bf16, 2.0);
  check_against_torch("softmax bf16 vs torch bf16", [](const std::vector<Array>& in) { return softmax(in[0]); },
                      "out = torch.softmax(x0, dim=-1)", {x}, default_tolerance(DType::bf16));
  check_against_torch("log_softmax bf16 vs torch bf16",
                      [](const std::vector<Array>& in) { return log_softmax(in[0]); },
                      "out = torch.log_softmax(x0, dim=-1)", {x}, default_tolerance(DType::bf16));
}

TEST(SoftmaxOracle, LargeMagnitudesAreStable) {
  // Logits in the thousands overflow a naive exp; references are computed in f64.
  for (double scale : {1e3, 1e6}) {
    Array x = random_normal({5, 11}, 9, DType::f32, scale);
    for (int axis : {-1, 0}) {
      std::string ax = std::to_string(axis);
      check_against_torch("softmax scale " + std::to_string(scale) + " axis " + ax,
                          [axis](const std::vector<Array>& in) { return softmax(in[0], axis); },
                          "out = torch.softmax(x0.double(), dim=" + ax + ").float()", {x});
      check_against_torch("log_softmax scale " + std::to_string(scale) + " axis " + ax,
                          [axis](const std::vector<Array>& in) { return log_softmax(in[0], axis); },
                          "out = torch.log_softmax(x0.double(), dim=" + ax + ").float()", {x});
    }
  }
  Array same = Array::full({2, 4}, 3e30);
  EXPECT_EQ(softmax(same).to_floats(), std::vector<float>(8, 0.25f));
  // Masked (-inf) entries get probability 0 and log-probability -inf; the rest stay finite.
  Array masked = Array::from_vector(std::vector<float>{1, -INFINITY, 2, -INFINITY, 0.5f, 0.5f}, {2, 3});
  check_against_torch("softmax -inf mask", [](const std::vector<Array>& in) { return softmax(in[0]); },
                      "out = torch.softmax(x0, dim=-1)", {masked});
  check_against_torch("log_softmax -inf mask", [](const std::vector<Array>& in) { return log_softmax(in[0]); },
                      "out = torch.log_softmax(x0, dim=-1)", {masked});
  Array big_bf = random_normal({4, 9}, 10, DType::bf16, 500.0);
  check_against_torch("softmax bf16 large", [](const std::vector<Array>& in) { return softmax(in[0]); },
                      softmax_torch(false, -1, DType::bf16), {big_bf}, default_tolerance(DType::bf16));
}

TEST(SoftmaxOracle, FiniteDifferences) {
  for (bool log : {false, true}) {
    for (const auto& c : kSoftmaxCases) {
      if (c.shape.numel() > 2000) continue;
      Array x = random_normal(c.shape, 11, DType::f32, 2.0);
      int axis = c.axis;
      check_finite_differences(std::string(log ? "log_softmax " : "softmax ") + c.shape.str() + " axis " +
                                   std::to_string(axis),
                               [log, axis](const std::vector<Array>& in) {
                                 return log ? log_softmax(in[0], axis) : softmax(in[0], axis);
                               },
                               {x});
    }
  }
}

TEST(SoftmaxOracle, SecondOrder) {
  // vjp of (x, c) -> vjp(softmax)(x; c): exercises the recomputed-output path of the VJP.
  Array x = random_normal({3, 6}, 12), c = random_normal({3, 6}, 13);
  for (bool log : {false, true}) {
    auto inner = [log](const std::vector<Array>& p) { return log ? log_softmax(p[0], 1) : softmax(p[0], 1); };
    auto fn = [inner](const std::vector<Array>& in) { return vjp(inner, {in[0]}, in[1]).second[0]; };
    std::string f = log ? "torch.log_softmax" : "torch.softmax";
    std::string code = "y = " + f + "(x0, dim=1)\nout, = torch.autograd.grad(y, x0, x1, create_graph=True)";
    std::string label = std::string(log ? "log_softmax" : "softmax") + " second order";
    check_against_torch(label, fn, code, {x, c});
    check_finite_differences(label, fn, {x, c});
  }
}

// ---- layer norm / RMS norm -----------------------------------------------------------

enum class Affine { none, weight, weight_bias, bias };

const char* affine_name(Affine a) {
  switch (a) {
    case Affine::none: return "no affine";
    case Affine::weight: return "weight";
    case Affine::weight_bias: return "weight+bias";
    case Affine::bias: return "bias";
  }
  return "";
}

struct NormSetup {
  std::vector<Array> inputs;  // x, then the defined params in order (weight, bias)
  bool has_w = false, has_b = false;

  Array w(const std::vector<Array>& in) const { return has_w ? in[1] : Array(); }
  Array b(const std::vector<Array>& in) const { return has_b ? in[has_w ? 2 : 1] : Array(); }
  std::string torch_w() const { return has_w ? "x1.float()" : "None"; }
  std::string torch_b() const { return has_b ? (has_w ? "x2.float()" : "x1.float()") : "None"; }
};

NormSetup make_norm(const Shape& shape, Affine affine, DType x_dtype, DType p_dtype, uint64_t seed) {
  NormSetup s;
  const int64_t c = shape.dim(-1);
  s.inputs.push_back(add(random_normal(shape, seed, x_dtype, 2.0), 0.5));  // nonzero mean
  s.has_w = affine == Affine::weight || affine == Affine::weight_bias;
  s.has_b = affine == Affine::weight_bias || affine == Affine::bias;
  if (s.has_w) s.inputs.push_back(random_uniform({c}, seed + 1, 0.5, 1.5, p_dtype));
  if (s.has_b) s.inputs.push_back(random_normal({c}, seed + 2, p_dtype, 0.5));
  return s;
}

std::string layer_norm_torch(const NormSetup& s, int64_t c, double eps) {
  std::ostringstream os;
  os << "out = F.layer_norm(x0.float(), (" << c << ",), " << s.torch_w() << ", " << s.torch_b() << ", " << eps
     << ").to(x0.dtype)";
  return os.str();
}

std::string rms_norm_torch(const NormSetup& s, double eps) {
  std::ostringstream os;
  os << "xf = x0.float()\ny = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + " << eps << ")\n"
     << (s.has_w ? "y = y * x1.float()\n" : "") << "out = y.to(x0.dtype)";
  return os.str();
}

Tolerance norm_tolerance(DType x_dtype, DType p_dtype) {
  if (x_dtype == DType::f32 && p_dtype == DType::f32) return {2e-5, 1e-5};  // sums over 768 features
  return default_tolerance(DType::bf16);
}

struct DtypeCombo {
  DType x, p;
};
const DtypeCombo kCombos[] = {{DType::f32, DType::f32}, {DType::bf16, DType::bf16}, {DType::bf16, DType::f32}};
const Shape kNormShapes[] = {{2, 3, 7}, {5, 768}, {200, 100}, {1, 1}};

std::string combo_name(DtypeCombo d) {
  return std::string("x ") + dtype_name(d.x) + (d.x == d.p ? "" : std::string(" params ") + dtype_name(d.p));
}

TEST(NormOracle, LayerNormForwardAndFusedBackward) {
  for (const Shape& shape : kNormShapes) {
    for (Affine affine : {Affine::none, Affine::weight, Affine::weight_bias, Affine::bias}) {
      for (DtypeCombo d : kCombos) {
        if (affine == Affine::none && d.p != d.x) continue;
        NormSetup s = make_norm(shape, affine, d.x, d.p, 21);
        auto fn = [s](const std::vector<Array>& in) { return layer_norm(in[0], s.w(in), s.b(in)); };
        check_against_torch("layer_norm " + shape.str() + " " + affine_name(affine) + " " + combo_name(d), fn,
                            layer_norm_torch(s, shape.dim(-1), 1e-5), s.inputs, norm_tolerance(d.x, d.p));
      }
    }
  }
  // A non-default eps matters for small-variance rows.
  NormSetup s = make_norm({4, 9}, Affine::weight_bias, DType::f32, DType::f32, 22);
  s.inputs[0] = mul(s.inputs[0], 1e-3);
  check_against_torch("layer_norm eps 1e-2",
                      [s](const std::vector<Array>& in) { return layer_norm(in[0], s.w(in), s.b(in), 1e-2); },
                      layer_norm_torch(s, 9, 1e-2), s.inputs);
}

TEST(NormOracle, RmsNormForwardAndFusedBackward) {
  for (const Shape& shape : kNormShapes) {
    for (Affine affine : {Affine::none, Affine::weight}) {
      for (DtypeCombo d : kCombos) {
        if (affine == Affine::none && d.p != d.x) continue;
        NormSetup s = make_norm(shape, affine, d.x, d.p, 31);
        auto fn = [s](const std::vector<Array>& in) { return rms_norm(in[0], s.w(in)); };
        check_against_torch("rms_norm " + shape.str() + " " + affine_name(affine) + " " + combo_name(d), fn,
                            rms_norm_torch(s, 1e-6), s.inputs, norm_tolerance(d.x, d.p));
      }
    }
  }
  NormSetup s = make_norm({3, 10}, Affine::weight, DType::f32, DType::f32, 32);
  check_against_torch("rms_norm eps 1e-1", [s](const std::vector<Array>& in) { return rms_norm(in[0], s.w(in), 0.1); },
                      rms_norm_torch(s, 0.1), s.inputs);
}

TEST(NormOracle, FiniteDifferences) {
  for (const Shape& shape : {Shape{2, 3, 7}, Shape{5, 768}}) {
    for (Affine affine : {Affine::none, Affine::weight, Affine::weight_bias, Affine::bias}) {
      NormSetup s = make_norm(shape, affine, DType::f32, DType::f32, 41);
      check_finite_differences("layer_norm " + shape.str() + " " + affine_name(affine),
                               [s](const std::vector<Array>& in) { return layer_norm(in[0], s.w(in), s.b(in)); },
                               s.inputs);
      if (affine == Affine::none || affine == Affine::weight)
        check_finite_differences("rms_norm " + shape.str() + " " + affine_name(affine),
                                 [s](const std::vector<Array>& in) { return rms_norm(in[0], s.w(in)); }, s.inputs);
    }
  }
}

// Second order through the composed VJP: out = concat(flattened grads of the norm at
// cotangent c) as a function of (x, params..., c), compared with torch create_graph=True.
void check_norm_second_order(bool center, Affine affine, const Shape& shape) {
  NormSetup s = make_norm(shape, affine, DType::f32, DType::f32, 51);
  const size_t np = s.inputs.size();
  std::vector<Array> inputs = s.inputs;
  inputs.push_back(random_normal(shape, 52));  // inner cotangent
  auto norm = [s, center](const std::vector<Array>& p) {
    return center ? layer_norm(p[0], s.w(p), s.b(p)) : rms_norm(p[0], s.w(p));
  };
  auto fn = [norm, np](const std::vector<Array>& in) {
    std::vector<Array> primals(in.begin(), in.begin() + long(np));
    auto grads = vjp(norm, primals, in[np]).second;
    std::vector<Array> flat;
    for (const Array& g : grads) flat.push_back(reshape(g, {-1}));
    return concatenate(flat, 0);
  };
  std::ostringstream code;
  std::string ps = "x0";
  for (size_t i = 1; i < np; ++i) ps += ", x" + std::to_string(i);
  const int64_t c = shape.dim(-1);
  // Affine terms applied outside F.layer_norm: torch 1.13's layer_norm double backward
  // fails for a bias without a weight.
  if (center)
    code << "y = F.layer_norm(x0, (" << c << ",), None, None, 1e-5)\n";
  else
    code << "y = x0 * torch.rsqrt(x0.pow(2).mean(-1, keepdim=True) + 1e-6)\n";
  if (s.has_w) code << "y = y * x1\n";
  if (s.has_b) code << "y = y + x" << (s.has_w ? 2 : 1) << "\n";
  code << "gs = torch.autograd.grad(y, [" << ps << "], x" << np << ", create_graph=True)\n"
       << "out = torch.cat([g.reshape(-1) for g in gs])";
  std::string label = std::string(center ? "layer_norm" : "rms_norm") + " second order " + shape.str() + " " +
                      affine_name(affine);
  // Forward here = first-order grads from the composed VJP (fn runs nested inside vjp).
  check_against_torch(label, fn, code.str(), inputs, {2e-5, 1e-5});
  // The fused first-order kernel (fn at top level) agrees with the composed VJP...
  Array fused = fn(inputs);
  Array composed = vjp(fn, inputs, Array::zeros(fused.shape())).first;
  expect_close(fused, composed, {1e-5, 1e-5}, label + " fused vs composed");
  // ...and finite differences of the fused gradients match the composed second order.
  check_finite_differences(label, fn, inputs);
}

TEST(NormOracle, SecondOrderUsesComposedVjp) {
  for (Affine affine : {Affine::none, Affine::weight, Affine::weight_bias, Affine::bias}) {
    check_norm_second_order(true, affine, {2, 3, 7});
    check_norm_second_order(true, affine, {4, 33});
  }
  for (Affine affine : {Affine::none, Affine::weight}) {
    check_norm_second_order(false, affine, {2, 3, 7});
    check_norm_second_order(false, affine, {4, 33});
  }
}

TEST(NormOracle, MixedPrecisionSecondOrder) {
  // bf16 activations with f32 params under nested differentiation: dtypes of every gradient.
  NormSetup s = make_norm({3, 8}, Affine::weight_bias, DType::bf16, DType::f32, 61);
  Array c = random_normal({3, 8}, 62, DType::bf16);
  auto inner = [s](const std::vector<Array>& p) { return layer_norm(p[0], s.w(p), s.b(p)); };
  auto [y, g1] = vjp(inner, s.inputs, c);
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(g1[0].dtype(), DType::bf16);
  EXPECT_EQ(g1[1].dtype(), DType::f32);
  EXPECT_EQ(g1[2].dtype(), DType::f32);
  auto fn = [inner](const std::vector<Array>& in) {
    return vjp(inner, {in[0], in[1], in[2]}, in[3]).second[1];  // d/dweight
  };
  std::vector<Array> inputs = s.inputs;
  inputs.push_back(c);
  check_against_torch("layer_norm bf16/f32 second order",
                      fn,
                      "y = F.layer_norm(x0.float(), (8,), x1, x2, 1e-5).to(x0.dtype)\n"
                      "out = torch.autograd.grad(y, [x0, x1, x2], x3, create_graph=True)[1]",
                      inputs, default_tolerance(DType::bf16));
}

TEST(NormOracle, ValueAndGradWithParams) {
  // The usual entry point: grads of a scalar loss over a Params tree hold each param's dtype.
  Params params;
  params.set("ln.weight", random_uniform({7}, 71, 0.5, 1.5));
  params.set("ln.bias", random_normal({7}, 72));
  params.set("rms.weight", random_uniform({7}, 73, 0.5, 1.5));
  Array x = random_normal({3, 7}, 74);
  auto loss = [&x](const Params& p) {
    Array h = layer_norm(x, p.at("ln.weight"), p.at("ln.bias"));
    h = rms_norm(softmax(h), p.at("rms.weight"));
    return sum(mul(h, h));
  };
  auto [value, grads] = value_and_grad(loss)(params);
  EXPECT_EQ(grads.at("ln.weight").shape(), (Shape{7}));
  EXPECT_TRUE(std::isfinite(value.item()));
  OracleResult ref = TorchOracle::instance().run(
      "w1, b1, w2, x = xs\nfor t in (w1, b1, w2):\n    t.requires_grad_(True)\nh = F.layer_norm(x, (7,), w1, b1, 1e-5)\nh = torch.softmax(h, -1)\n"
      "h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w2\nl = (h * h).sum()\n"
      "out = [l] + list(torch.autograd.grad(l, [w1, b1, w2]))",
      {to_oracle(params.at("ln.weight")), to_oracle(params.at("ln.bias")), to_oracle(params.at("rms.weight")),
       to_oracle(x)});
  ASSERT_EQ(ref.outputs.size(), 4u);
  expect_close(value, ref.outputs[0], {1e-4, 1e-5}, "value_and_grad loss");
  expect_close(grads.at("ln.weight"), ref.outputs[1], {2e-5, 1e-5}, "value_and_grad ln.weight");
  expect_close(grads.at("ln.bias"), ref.outputs[2], {2e-5, 1e-5}, "value_and_grad ln.bias");
  expect_close(grads.at("rms.weight"), ref.outputs[3], {2e-5, 1e-5}, "value_and_grad rms.weight");
}

TEST(NormOracle, Float16) {
  // f16 shares the f32-compute path; references compute in f32 and round once.
  Array x = random_normal({5, 19}, 81, DType::f16, 2.0);
  Array w = random_uniform({19}, 82, 0.5, 1.5, DType::f16), b = random_normal({19}, 83, DType::f16);
  Tolerance tol = default_tolerance(DType::f16);
  check_against_torch("softmax f16", [](const std::vector<Array>& in) { return softmax(in[0], 0); },
                      "out = torch.softmax(x0.float(), dim=0).half()", {x}, tol);
  check_against_torch("layer_norm f16", [](const std::vector<Array>& in) { return layer_norm(in[0], in[1], in[2]); },
                      "out = F.layer_norm(x0.float(), (19,), x1.float(), x2.float(), 1e-5).half()", {x, w, b}, tol);
  check_against_torch("rms_norm f16", [](const std::vector<Array>& in) { return rms_norm(in[0], in[1]); },
                      "xf = x0.float()\nout = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * x1.float()).half()",
                      {x, w}, tol);
}

TEST(NormOracle, FusedBackwardIsDeterministicAcrossThreadCounts) {
  // Weight/bias grads sum fixed row chunks in a fixed order, whatever the thread count.
  NormSetup s = make_norm({517, 96}, Affine::weight_bias, DType::f32, DType::f32, 91);
  Array c = random_normal({517, 96}, 92);
  auto grads_with = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    auto g = vjp([&s](const std::vector<Array>& in) { return layer_norm(in[0], s.w(in), s.b(in)); }, s.inputs, c).second;
    omp_set_num_threads(saved);
    return g;
  };
  auto one = grads_with(1), two = grads_with(2);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i].to_floats(), two[i].to_floats()) << "grad " << i;
}

TEST(NnOpsErrors, NameOpAndShapes) {
  Array x = Array::zeros({2, 3, 7});
  Array w7 = Array::ones({7}), b7 = Array::zeros({7});
  expect_error([&] { layer_norm(x, Array::ones({6}), b7); }, {"[layer_norm]", "weight", "(6,)", "(7,)", "(2, 3, 7)"});
  expect_error([&] { layer_norm(x, w7, Array::zeros({3, 7})); }, {"[layer_norm]", "bias", "(3, 7)", "(7,)"});
  expect_error([&] { layer_norm(x, w7, Array::zeros({7}, DType::bf16)); }, {"[layer_norm]", "dtypes differ"});
  expect_error([&] { layer_norm(Array::zeros({2, 7}, DType::i32), w7, b7); }, {"[layer_norm]", "i32"});
  expect_error([&] { layer_norm(x, Array::zeros({7}, DType::i64), Array()); }, {"[layer_norm]", "weight", "i64"});
  expect_error([&] { layer_norm(Array::scalar(1.0), Array(), Array()); }, {"[layer_norm]", "last dimension"});
  expect_error([&] { layer_norm(Array::zeros({4, 0}), Array(), Array()); }, {"[layer_norm]", "(4, 0)"});
  expect_error([&] { layer_norm(x, w7, b7, -1.0); }, {"[layer_norm]", "eps"});
  expect_error([&] { layer_norm(Array(), w7, b7); }, {"[layer_norm]", "undefined"});
  expect_error([&] { rms_norm(x, Array::ones({3})); }, {"[rms_norm]", "weight", "(3,)", "(7,)", "(2, 3, 7)"});
  expect_error([&] { rms_norm(Array::zeros({2}, DType::boolean), Array()); }, {"[rms_norm]", "bool"});
  expect_error([&] { softmax(x, 3); }, {"[softmax]", "axis 3", "(2, 3, 7)"});
  expect_error([&] { log_softmax(x, -4); }, {"[log_softmax]", "axis -4", "(2, 3, 7)"});
  expect_error([&] { softmax(Array::zeros({3}, DType::i64)); }, {"[softmax]", "i64"});
  expect_error([&] { log_softmax(Array()); }, {"[log_softmax]", "undefined"});
  // Empty arrays are fine where torch allows them.
  EXPECT_EQ(softmax(Array::zeros({0, 5})).shape(), (Shape{0, 5}));
  EXPECT_EQ(layer_norm(Array::zeros({0, 5}), Array(), Array()).shape(), (Shape{0, 5}));
}

}  // namespace
}  // namespace mt::testing
