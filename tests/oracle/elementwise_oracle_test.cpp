// Every elementwise op's forward and VJP against PyTorch (f32, bf16, broadcasting, odd
// sizes), plus finite-difference checks of each VJP.
#include <gtest/gtest.h>

#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

struct UnaryCase {
  const char* name;
  Array (*fn)(const Array&);
  const char* torch;
  double lo, hi;  // input range keeping the op well defined
};

Array gelu_exact(const Array& x) { return gelu(x, false); }
Array gelu_tanh(const Array& x) { return gelu(x, true); }

const UnaryCase kUnary[] = {
    {"neg", neg, "out = -x0", -3, 3},
    {"exp", exp, "out = torch.exp(x0)", -3, 3},
    {"log", log, "out = torch.log(x0)", 0.1, 4},
    {"sqrt", sqrt, "out = torch.sqrt(x0)", 0.1, 4},
    {"rsqrt", rsqrt, "out = torch.rsqrt(x0)", 0.2, 4},
    {"tanh", tanh, "out = torch.tanh(x0)", -3, 3},
    {"abs", abs, "out = torch.abs(x0)", -3, 3},
    {"square", square, "out = torch.square(x0)", -3, 3},
    {"reciprocal", reciprocal, "out = torch.reciprocal(x0)", 0.3, 3},
    {"erf", erf, "out = torch.erf(x0)", -2, 2},
    {"sin", sin, "out = torch.sin(x0)", -3, 3},
    {"cos", cos, "out = torch.cos(x0)", -3, 3},
    {"sigmoid", sigmoid, "out = torch.sigmoid(x0)", -4, 4},
    {"relu", relu, "out = torch.relu(x0)", -3, 3},
    {"silu", silu, "out = F.silu(x0)", -4, 4},
    {"gelu", gelu_exact, "out = F.gelu(x0)", -4, 4},
    {"gelu_tanh", gelu_tanh, "out = F.gelu(x0, approximate='tanh')", -4, 4},
};

TEST(ElementwiseOracle, UnaryF32AndBf16) {
  for (const auto& c : kUnary) {
    for (DType dt : {DType::f32, DType::bf16}) {
      Array x = random_uniform({7, 13}, 11, c.lo, c.hi, dt);
      auto fn = [&](const std::vector<Array>& in) { return c.fn(in[0]); };
      check_against_torch(std::string(c.name) + "/" + dtype_name(dt), fn, c.torch, {x}, default_tolerance(dt));
    }
  }
}

TEST(ElementwiseOracle, UnaryFiniteDifferences) {
  for (const auto& c : kUnary) {
    if (std::string(c.name) == "abs" || std::string(c.name) == "relu") continue;  // kinks: checked below
    Array x = random_uniform({5, 3}, 12, c.lo, c.hi);
    check_finite_differences(c.name, [&](const std::vector<Array>& in) { return c.fn(in[0]); }, {x});
  }
  // Away from the kink the piecewise ops have smooth directional derivatives.
  Array pos = random_uniform({5, 3}, 13, 0.5, 2);
  check_finite_differences("abs", [](const std::vector<Array>& in) { return abs(in[0]); }, {pos});
  check_finite_differences("relu", [](const std::vector<Array>& in) { return relu(in[0]); }, {pos});
}

struct BinaryCase {
  const char* name;
  Array (*fn)(const Array&, const Array&);
  const char* torch;
  double lo, hi;
};

const BinaryCase kBinary[] = {
    {"add", add, "out = x0 + x1", -3, 3},
    {"sub", sub, "out = x0 - x1", -3, 3},
    {"mul", mul, "out = x0 * x1", -3, 3},
    {"div", div, "out = x0 / x1", 0.5, 3},
    {"pow", pow, "out = torch.pow(x0, x1)", 0.5, 2},
    {"maximum", maximum, "out = torch.maximum(x0, x1)", -3, 3},
    {"minimum", minimum, "out = torch.minimum(x0, x1)", -3, 3},
};

TEST(ElementwiseOracle, BinaryBroadcasting) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{4, 5}, {4, 5}}, {{3, 1, 5}, {4, 1}}, {{1}, {2, 3}}, {{}, {6, 7}}, {{2, 3, 4}, {3, 1}}, {{33}, {1}}};
  for (const auto& c : kBinary) {
    for (const auto& [sa, sb] : shapes) {
      for (DType dt : {DType::f32, DType::bf16}) {
        Array a = random_uniform(sa, 21, c.lo, c.hi, dt);
        Array b = random_uniform(sb, 22, c.lo, c.hi, dt);
        auto fn = [&](const std::vector<Array>& in) { return c.fn(in[0], in[1]); };
        check_against_torch(std::string(c.name) + " " + sa.str() + "x" + sb.str() + "/" + dtype_name(dt), fn,
                            c.torch, {a, b}, default_tolerance(dt));
      }
    }
  }
}

TEST(ElementwiseOracle, BinaryFiniteDifferences) {
  for (const auto& c : kBinary) {
    Array a = random_uniform({3, 4}, 31, c.lo, c.hi);
    Array b = random_uniform({4}, 32, c.lo, c.hi);
    check_finite_differences(c.name, [&](const std::vector<Array>& in) { return c.fn(in[0], in[1]); }, {a, b});
  }
}

TEST(ElementwiseOracle, MaximumTiesSplitGradient) {
  Array a = Array::from_vector(std::vector<float>{1, 2, 3}, {3});
  Array b = Array::from_vector(std::vector<float>{1, 5, 0}, {3});
  check_against_torch("maximum ties", [](const std::vector<Array>& in) { return maximum(in[0], in[1]); },
                      "out = torch.maximum(x0, x1)", {a, b});
}

TEST(ElementwiseOracle, PowZeroBase) {
  Array a = Array::from_vector(std::vector<float>{0, 0, 2}, {3});
  Array b = Array::from_vector(std::vector<float>{2, 3, 0.5}, {3});
  check_against_torch("pow zero base", [](const std::vector<Array>& in) { return pow(in[0], in[1]); },
                      "out = torch.pow(x0, x1)", {a, b});
}

TEST(ElementwiseOracle, ComparisonsWhereCast) {
  Array a = random_ints({4, 5}, 41, -2, 3, DType::i64);
  Array b = random_ints({5}, 42, -2, 3, DType::i64);
  const std::vector<std::pair<const char*, Array (*)(const Array&, const Array&)>> cmps = {
      {"eq", eq}, {"ne", ne}, {"lt", lt}, {"le", le}, {"gt", gt}, {"ge", ge}};
  for (auto [name, fn] : cmps) {
    std::string code = std::string("out = torch.") + name + "(x0, x1)";
    check_against_torch(name, [fn = fn](const std::vector<Array>& in) { return fn(in[0], in[1]); }, code, {a, b});
  }
  Array fa = random_normal({4, 5}, 43), fb = random_normal({4, 1}, 44);
  Array cond = gt(random_normal({5}, 45), Array::scalar(0.0));
  check_against_torch("where", [&](const std::vector<Array>& in) { return where(cond, in[0], in[1]); },
                      "out = torch.where(x2, x0, x1)", {fa, fb, cond});
  check_finite_differences("where", [&](const std::vector<Array>& in) { return where(cond, in[0], in[1]); },
                           {fa, fb});
  for (DType to : {DType::bf16, DType::f16, DType::i32, DType::i64}) {
    std::string code = "out = x0.to(torch." + torch_dtype(to) + ")";
    check_against_torch(std::string("cast f32->") + dtype_name(to),
                        [to](const std::vector<Array>& in) { return cast(in[0], to); }, code,
                        {mul(fa, 10.0)}, default_tolerance(to));
  }
  check_against_torch("cast bf16->f32", [](const std::vector<Array>& in) { return cast(in[0], DType::f32); },
                      "out = x0.float()", {cast(fa, DType::bf16)});
}

TEST(ElementwiseErrors, NameOpAndShapes) {
  Array a = Array::zeros({2, 3}), b = Array::zeros({4, 3});
  try {
    add(a, b);
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[add]"), std::string::npos) << m;
    EXPECT_NE(m.find("(2, 3)"), std::string::npos) << m;
    EXPECT_NE(m.find("(4, 3)"), std::string::npos) << m;
  }
  EXPECT_THROW(mul(a, Array::zeros({2, 3}, DType::bf16)), Error);
  EXPECT_THROW(log(Array::zeros({2}, DType::i64)), Error);
  EXPECT_THROW(where(a, a, a), Error);  // condition must be bool
}

}  // namespace
}  // namespace mt::testing

namespace mt::testing {
namespace {

// First-order gelu backward is a fused kernel; under nested differentiation the composed
// rule runs instead. Check the second derivative of both forms against torch.
TEST(ElementwiseOracle, GeluSecondOrder) {
  Array x = random_uniform({9}, 51, -3, 3);
  Array v = random_normal({9}, 52);
  for (bool approximate : {false, true}) {
    auto f = [approximate](const Params& p) { return sum(gelu(p.at("x"), approximate)); };
    auto gv = [&](const Params& p) { return sum(mul(grad(f)(p).at("x"), v)); };
    Params hvp = grad(gv)(Params{{"x", x}});
    std::string code = std::string("y = F.gelu(x0") + (approximate ? ", approximate='tanh'" : "") +
                       ").sum()\ng, = torch.autograd.grad(y, (x0,), create_graph=True)\nout = (g * x1).sum()";
    OracleResult ref =
        TorchOracle::instance().run(code, {to_oracle(x), to_oracle(v)}, {OracleTensor{{}, "float32", {1.0}}});
    expect_close(hvp.at("x"), *ref.grads[0], {1e-5, 1e-5}, approximate ? "gelu_tanh hvp" : "gelu hvp");
  }
}

}  // namespace
}  // namespace mt::testing
