// The fused layer ops against the composed ops they replace (their reference): forward and
// every gradient; in f32 the residual ops bit for bit, the activation's gradient within 2 ulp
// (the same expression in a vector body or a scalar tail rounds differently), bias
// and weight gradients (summed in another order) within 1e-5 relative; bf16 within its rounding, odd and multi-chunk shapes (rows > 64, several
// threads), rate 0 and eval mode, and second-order gradients through the nested path. The
// PyTorch comparison and the sharded runs are the primitive harness's cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

double max_abs_diff(const Array& a, const Array& b) {
  std::vector<float> x = a.to_floats(), y = b.to_floats();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::abs(x[i] - y[i])));
  return worst;
}

double max_abs(const Array& a) {
  double m = 0;
  for (float v : a.to_floats()) m = std::max(m, double(std::abs(v)));
  return m;
}

// Bit for bit, or within `ulps` units in the last place of each value (of a sixteenth of the
// array's largest value for values near a cancellation, where GeLU' crosses zero).
void expect_bitwise(const Array& a, const Array& b, const std::string& what, int ulps = 0) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  std::vector<float> x = a.to_floats(), y = b.to_floats();
  const float floor = std::max(float(max_abs(b)) / 16, 1e-30f);
  size_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::memcmp(&x[i], &y[i], sizeof(float)) == 0) continue;
    const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::abs(y[i]), floor)) - 23);
    differ += std::abs(double(x[i]) - double(y[i])) > ulps * ulp;
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << x.size() << " differ by more than " << ulps
                        << " ulp, max " << max_abs_diff(a, b);
}

void expect_close(const Array& a, const Array& b, double rel, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const double err = max_abs_diff(a, b), scale = std::max(1.0, max_abs(b));
  std::printf("  %-44s max err %.3g (max |ref| %.3g)\n", what.c_str(), err, max_abs(b));
  EXPECT_LE(err, rel * scale) << what;
}

// The loss both forms are differentiated through: a fixed random projection of the output,
// so every element's gradient differs.
Array project(const Array& y, uint64_t seed) { return sum(mul(cast(y, DType::f32), random_normal(y.shape(), seed))); }

struct Grads {
  Array loss;
  Params grads;
};

Grads run(const std::function<Array(const Params&)>& f, const Params& p) {
  auto [loss, g] = value_and_grad(f)(p);
  return {loss, g};
}

// Compares fused and composed: in f32 the loss and the gradients named in `exact` bit for
// bit (within `ulps`), the others (sums over rows in another order) within `rel`.
void compare(const std::function<Array(const Params&)>& fused, const std::function<Array(const Params&)>& composed,
             const Params& p, const std::vector<std::string>& exact, double rel, bool bf16, int ulps = 0) {
  Grads a = run(fused, p), b = run(composed, p);
  if (bf16) {
    expect_close(a.loss, b.loss, rel, "loss");
  } else {
    expect_bitwise(a.loss, b.loss, "loss", ulps);
  }
  for (const auto& [path, g] : b.grads) {
    const bool bitwise = !bf16 && std::find(exact.begin(), exact.end(), path) != exact.end();
    if (bitwise) expect_bitwise(a.grads[path], g, "d/d" + path, ulps);
    else expect_close(a.grads[path], g, rel, "d/d" + path);
  }
}

Params cast_params(Params p, DType dtype) {
  Params out;
  for (const auto& [k, v] : p) out.set(k, cast(v, dtype));
  return out;
}

class FusedOps : public ::testing::TestWithParam<DType> {};

TEST_P(FusedOps, BiasActivationEqualsComposed) {
  const DType dt = GetParam();
  const bool bf16 = dt == DType::bf16;
  // 2·67 rows (several 64-row chunks of the bias gradient), 37 features (vector tails).
  for (auto [act, name] : {std::pair{FusedActivation::gelu, "gelu"}, {FusedActivation::gelu_tanh, "gelu_tanh"},
                           {FusedActivation::relu, "relu"}}) {
    SCOPED_TRACE(name);
    Params p = cast_params(Params{{"y", random_normal({2, 67, 37}, 1)}, {"b", random_normal({37}, 2)}}, dt);
    auto fused = [act = act](const Params& q) { return project(bias_activation(q["y"], q["b"], act), 3); };
    auto composed = [act = act](const Params& q) {
      Array pre = add(q["y"], q["b"]);
      Array h = act == FusedActivation::relu ? relu(pre) : gelu(pre, act == FusedActivation::gelu_tanh);
      return project(h, 3);
    };
    compare(fused, composed, p, {"y"}, bf16 ? 1e-2 : 1e-5, bf16, 2);
  }
}

TEST(FusedOps, BiasActivationTakesAnF32BiasOnBf16Activations) {
  Array y = cast(random_normal({5, 9}, 4), DType::bf16), b = random_normal({9}, 5);
  Array fused = bias_activation(y, b, FusedActivation::gelu_tanh);
  Array composed = gelu(cast(add(cast(y, DType::f32), b), DType::bf16), true);
  EXPECT_EQ(fused.dtype(), DType::bf16);
  expect_bitwise(fused, composed, "bf16 y + f32 bias");
}

TEST_P(FusedOps, AddDropoutEqualsComposed) {
  const DType dt = GetParam();
  const bool bf16 = dt == DType::bf16;
  const RngKey key{11, 3};
  for (double rate : {0.0, 0.1, 0.5}) {
    SCOPED_TRACE(rate);
    Params p = cast_params(Params{{"x", random_normal({3, 70, 33}, 6)}, {"a", random_normal({3, 70, 33}, 7)}}, dt);
    auto fused = [&](const Params& q) { return project(add_dropout(q["x"], q["a"], rate, key), 8); };
    auto composed = [&](const Params& q) { return project(add(q["x"], dropout(q["a"], rate, key, true)), 8); };
    compare(fused, composed, p, {"x", "a"}, bf16 ? 1e-2 : 1e-6, bf16);
  }
  // Eval mode is the plain sum.
  Array x = random_normal({4, 5}, 9), a = random_normal({4, 5}, 10);
  expect_bitwise(add_dropout(x, a, 0.3, key, false), add(x, a), "eval");
}

TEST_P(FusedOps, AddDropoutNormEqualsComposed) {
  const DType dt = GetParam();
  const bool bf16 = dt == DType::bf16;
  const RngKey key{12, 4};
  for (bool center : {true, false}) {
    for (double rate : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(center ? "layer_norm" : "rms_norm") + " rate " + std::to_string(rate));
      Params p = cast_params(Params{{"x", random_normal({2, 75, 45}, 13)},
                                    {"a", random_normal({2, 75, 45}, 14)},
                                    {"w", random_normal({45}, 15)},
                                    {"b", random_normal({45}, 16)}},
                             dt);
      auto fused = [&](const Params& q) {
        Array y = center ? add_dropout_layer_norm(q["x"], q["a"], q["w"], q["b"], 1e-5, rate, key)
                         : add_dropout_rms_norm(q["x"], q["a"], q["w"], 1e-6, rate, key);
        return project(y, 17);
      };
      auto composed = [&](const Params& q) {
        Array s = add(q["x"], dropout(q["a"], rate, key, true));
        return project(center ? layer_norm(s, q["w"], q["b"], 1e-5) : rms_norm(s, q["w"], 1e-6), 17);
      };
      Params used = p;
      if (!center) used = Params{{"x", p["x"]}, {"a", p["a"]}, {"w", p["w"]}};
      compare(fused, composed, used, {"x", "a"}, bf16 ? 2e-2 : 1e-5, bf16);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedOps, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(FusedOps, NormWithoutAffineParameters) {
  const RngKey key{5, 5};
  Array x = random_normal({9, 16}, 20), a = random_normal({9, 16}, 21);
  Array fused = add_dropout_layer_norm(x, a, Array(), Array(), 1e-5, 0.2, key);
  Array composed = layer_norm(add(x, dropout(a, 0.2, key, true)), Array(), Array(), 1e-5);
  expect_bitwise(fused, composed, "no weight, no bias");
}

// MAML-style: the gradient of a function of a gradient differentiates the VJP itself, which
// takes the composed path.
TEST(FusedOps, SecondOrderGradientsEqualComposed) {
  const RngKey key{6, 6};
  Params p{{"x", random_normal({4, 12}, 30)}, {"a", random_normal({4, 12}, 31)}, {"w", random_normal({12}, 32)},
           {"b", random_normal({12}, 33)}, {"y", random_normal({4, 12}, 34)}};
  auto outer = [&](bool fused) {
    return [&, fused](const Params& q) {
      auto inner = [&](const Params& r) {
        Array h = fused ? add_dropout_layer_norm(r["x"], r["a"], r["w"], r["b"], 1e-5, 0.25, key)
                        : layer_norm(add(r["x"], dropout(r["a"], 0.25, key, true)), r["w"], r["b"], 1e-5);
        Array z = fused ? bias_activation(r["y"], r["b"], FusedActivation::gelu)
                        : gelu(add(r["y"], r["b"]), false);
        Array s = fused ? add_dropout(h, z, 0.25, key) : add(h, dropout(z, 0.25, key, true));
        return project(square(s), 35);
      };
      Params g = grad(inner)(q);
      Array total = Array::scalar(0.0f);
      for (const auto& [k, v] : g) total = add(total, sum(square(v)));
      return total;
    };
  };
  Grads a = run(outer(true), p), b = run(outer(false), p);
  expect_close(a.loss, b.loss, 1e-5, "sum of squared inner gradients");
  for (const auto& [k, v] : b.grads) expect_close(a.grads[k], v, 1e-4, "second order d/d" + k);
}

TEST(FusedOps, BadInputsNameTheOpAndShapes) {
  const RngKey key{1, 1};
  Array x = random_normal({3, 4}, 1);
  try {
    add_dropout(x, random_normal({3, 5}, 2), 0.1, key);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[add_dropout]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(3, 5)"), std::string::npos) << e.what();
  }
  try {
    bias_activation(x, random_normal({5}, 3), FusedActivation::gelu);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[bias_activation]"), std::string::npos) << e.what();
  }
  try {
    add_dropout_layer_norm(x, x, random_normal({3}, 4), Array(), 1e-5, 0.1, key);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[add_dropout_layer_norm]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(add_dropout(x, x, 1.5, key), Error);
}

}  // namespace
}  // namespace mt::testing
