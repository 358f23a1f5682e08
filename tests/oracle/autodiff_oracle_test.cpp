// value_and_grad over Params, has_aux, stop_gradient, and nested (second-order)
// differentiation checked against PyTorch's autograd with create_graph=True.
#include <gtest/gtest.h>

#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

Array mse(const Array& pred, const Array& target) { return mean(square(sub(pred, target))); }

TEST(AutodiffOracle, MamlSecondOrderMatchesTorch) {
  Array w = random_normal({4, 3}, 1, DType::f32, 0.5);
  Array b = random_normal({3}, 2, DType::f32, 0.1);
  Array x_support = random_normal({6, 4}, 3), y_support = random_normal({6, 3}, 4);
  Array x_query = random_normal({5, 4}, 5), y_query = random_normal({5, 3}, 6);
  const double inner_lr = 0.3;

  auto model = [](const Params& p, const Array& x) { return tanh(add(matmul(x, p.at("w")), p.at("b"))); };
  auto inner_loss = [&](const Params& p) { return mse(model(p, x_support), y_support); };
  // One inner SGD step, then the query loss of the adapted parameters: the outer gradient
  // differentiates through the inner gradient (MAML).
  auto outer_loss = [&](const Params& p) {
    Params g = grad(inner_loss)(p);
    Params adapted;
    for (const auto& [path, value] : p) adapted.set(path, sub(value, mul(g.at(path), inner_lr)));
    return mse(model(adapted, x_query), y_query);
  };
  auto [loss, grads] = value_and_grad(outer_loss)(Params{{"w", w}, {"b", b}});

  const std::string code = R"(
w, b, xs_, ys_, xq, yq = x0, x1, x2, x3, x4, x5
inner = ((torch.tanh(xs_ @ w + b) - ys_) ** 2).mean()
gw, gb = torch.autograd.grad(inner, (w, b), create_graph=True)
w2, b2 = w - 0.3 * gw, b - 0.3 * gb
outer = ((torch.tanh(xq @ w2 + b2) - yq) ** 2).mean()
out = outer
)";
  OracleResult ref = TorchOracle::instance().run(
      code, {to_oracle(w), to_oracle(b), to_oracle(x_support), to_oracle(y_support), to_oracle(x_query),
             to_oracle(y_query)},
      {OracleTensor{{}, "float32", {1.0}}});
  expect_close(loss, ref.outputs[0], {1e-6, 1e-5}, "maml outer loss");
  expect_close(grads.at("w"), *ref.grads[0], {1e-6, 1e-5}, "maml d/dw");
  expect_close(grads.at("b"), *ref.grads[1], {1e-6, 1e-5}, "maml d/db");

  // The first-order approximation differs: the test can tell second-order terms apart.
  auto first_order = [&](const Params& p) {
    Params g = grad(inner_loss)(p);
    Params adapted;
    for (const auto& [path, value] : p) adapted.set(path, sub(value, mul(stop_gradient(g.at(path)), inner_lr)));
    return mse(model(adapted, x_query), y_query);
  };
  Params fo = grad(first_order)(Params{{"w", w}, {"b", b}});
  double diff = 0;
  auto a = fo.at("w").to_doubles(), c = grads.at("w").to_doubles();
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - c[i]));
  std::cout << "  first-order vs second-order max diff " << diff << "\n";
  EXPECT_GT(diff, 1e-4);
}

TEST(AutodiffOracle, HessianVectorProductOfSoftplusLike) {
  // grad of (grad f · v): a Hessian-vector product through exp/log/mul chains.
  Array x = random_normal({7}, 11);
  Array v = random_normal({7}, 12);
  auto f = [](const Params& p) { return sum(log(add(exp(mul(p.at("x"), p.at("x"))), 1.0))); };
  auto gv = [&](const Params& p) { return sum(mul(grad(f)(p).at("x"), v)); };
  Params hvp = grad(gv)(Params{{"x", x}});
  const std::string code = R"(
y = torch.log(torch.exp(x0 * x0) + 1).sum()
g, = torch.autograd.grad(y, (x0,), create_graph=True)
out = (g * x1).sum()
)";
  OracleResult ref = TorchOracle::instance().run(code, {to_oracle(x), to_oracle(v)}, {OracleTensor{{}, "float32", {1.0}}});
  expect_close(hvp.at("x"), *ref.grads[0], {1e-5, 1e-5}, "hvp");
}

TEST(Autodiff, HasAuxStopGradientAndUnusedParams) {
  Array w = Array::from_vector(std::vector<float>{1, 2, 3}, {3});
  Array u = Array::from_vector(std::vector<float>{5}, {1});
  auto f = [](const Params& p) {
    Array y = mul(p.at("w"), p.at("w"));
    return std::make_pair(sum(add(y, stop_gradient(y))), y);
  };
  auto [value, aux, grads] = value_and_grad(f, has_aux)(Params{{"w", w}, {"unused", u}});
  EXPECT_DOUBLE_EQ(value.item(), 28.0);
  EXPECT_EQ(aux.to_floats(), (std::vector<float>{1, 4, 9}));
  EXPECT_FALSE(aux.traced());  // aux leaves the trace detached
  EXPECT_EQ(grads.at("w").to_floats(), (std::vector<float>{2, 4, 6}));  // stop_gradient blocks the copy
  EXPECT_EQ(grads.at("unused").to_floats(), (std::vector<float>{0}));
  EXPECT_EQ(grads.paths(), (std::vector<std::string>{"w", "unused"}));
}

TEST(Autodiff, NonScalarLossIsAnError) {
  auto f = [](const Params& p) { return p.at("w"); };
  EXPECT_THROW(value_and_grad(f)(Params{{"w", Array::zeros({3})}}), Error);
}

TEST(Autodiff, GradOfSharedSubexpressionAccumulates) {
  // y = x*x used three times: the cotangents of its consumers must add up.
  auto f = [](const Params& p) {
    Array y = mul(p.at("x"), p.at("x"));
    return sum(add(add(y, mul(y, 2.0)), exp(y)));
  };
  Array x = Array::from_vector(std::vector<float>{0.5f, -1.0f}, {2});
  Params g = grad(f)(Params{{"x", x}});
  auto gx = g.at("x").to_doubles();
  for (int i = 0; i < 2; ++i) {
    double xi = x.to_doubles()[size_t(i)];
    EXPECT_NEAR(gx[size_t(i)], (3 + std::exp(xi * xi)) * 2 * xi, 1e-5);
  }
}

}  // namespace
}  // namespace mt::testing
