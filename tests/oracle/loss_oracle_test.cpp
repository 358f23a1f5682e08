// cross_entropy (fused), linear_cross_entropy and mse_loss against torch.nn.functional: every reduction,
// ignore_index, label smoothing, (N, C) and (B, T, C), f32 and bf16 logits; the fused
// rule against its composed reference; second-order gradients (nested differentiation
// takes the composed path) against torch double backward; finite differences; errors.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/support/op_check.h"

namespace mt::testing {
namespace {


const char* reduction_name(Reduction r) { return r == Reduction::mean ? "mean" : r == Reduction::sum ? "sum" : "none"; }

// Labels in [0, c) with every `ignore_every`-th one set to `ignore_index`.
Array make_labels(const Shape& shape, int64_t c, uint64_t seed, int64_t ignore_index, int ignore_every,
                  DType dt = DType::i64) {
  std::vector<int64_t> v = random_ints(shape, seed, 0, c).to_ints();
  if (ignore_every > 0)
    for (size_t i = 0; i < v.size(); i += size_t(ignore_every)) v[i] = ignore_index;
  return Array::from_vector(v, shape, dt);
}

// torch call on (N, C) or (B, T, C) logits `y` with classes last.
std::string torch_ce(int rank, int64_t ignore_index, double smoothing, Reduction r) {
  std::string args = ", ignore_index=" + std::to_string(ignore_index) +
                     ", label_smoothing=" + std::to_string(smoothing) + ", reduction='" + reduction_name(r) + "')";
  if (rank == 2) return "F.cross_entropy(y, x1.long()" + args;
  return "F.cross_entropy(y.permute(0, 2, 1), x1.long()" + args;  // torch wants classes on dim 1
}

struct CeCase {
  Shape logits;
  int64_t ignore_index;
  int ignore_every;
  double smoothing;
};

const CeCase kCases[] = {
    {{37, 1000}, -100, 5, 0.0},   {{37, 1000}, -100, 4, 0.1},
    {{3, 11, 257}, -100, 7, 0.0}, {{3, 11, 257}, 0, 0, 0.3},  // ignore_index is a real class (padding id 0)
    {{64, 1023}, -100, 3, 0.05},                              // parallel rows
    {{5, 1}, -100, 0, 0.2},                                   // a single class
};

TEST(LossOracle, CrossEntropyF32MatchesTorch) {
  int seed = 0;
  for (const CeCase& c : kCases) {
    const int64_t classes = c.logits[c.logits.ndim() - 1];
    std::vector<int64_t> lead(c.logits.dims().begin(), c.logits.dims().end() - 1);
    for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
      ++seed;
      Array logits = random_normal(c.logits, 10 + seed, DType::f32, 3.0);
      Array labels = make_labels(Shape(lead), classes, 20 + seed, c.ignore_index, c.ignore_every,
                                 seed % 2 ? DType::i32 : DType::i64);
      std::string label = "cross_entropy " + c.logits.str() + " ignore " + std::to_string(c.ignore_index) + " ls " +
                          std::to_string(c.smoothing) + " " + reduction_name(r);
      auto fn = [&](const std::vector<Array>& in) {
        return cross_entropy(in[0], in[1], c.ignore_index, c.smoothing, r);
      };
      check_against_torch(label, fn, "y = x0\nout = " + torch_ce(c.logits.ndim(), c.ignore_index, c.smoothing, r),
                          {logits, labels});
      // The fused rule equals its composed reference, forward and backward.
      auto ref = [&](const std::vector<Array>& in) {
        return cross_entropy_reference(in[0], in[1], c.ignore_index, c.smoothing, r);
      };
      Array cot = random_normal(fn({logits, labels}).shape(), 99);
      auto [o1, g1] = vjp(fn, {logits, labels}, cot);
      auto [o2, g2] = vjp(ref, {logits, labels}, cot);
      expect_close(o1, o2, {1e-5, 1e-5}, label + " fused vs composed forward");
      expect_close(g1[0], g2[0], {1e-6, 1e-5}, label + " fused vs composed grad");
    }
  }
}

TEST(LossOracle, CrossEntropyBf16Logits) {
  int seed = 100;
  for (const CeCase& c : kCases) {
    const int64_t classes = c.logits[c.logits.ndim() - 1];
    std::vector<int64_t> lead(c.logits.dims().begin(), c.logits.dims().end() - 1);
    for (Reduction r : {Reduction::mean, Reduction::none}) {
      ++seed;
      Array logits = random_normal(c.logits, seed, DType::bf16, 3.0);
      Array labels = make_labels(Shape(lead), classes, seed + 1, c.ignore_index, c.ignore_every);
      std::string label =
          "cross_entropy bf16 " + c.logits.str() + " ls " + std::to_string(c.smoothing) + " " + reduction_name(r);
      auto fn = [&](const std::vector<Array>& in) {
        return cross_entropy(in[0], in[1], c.ignore_index, c.smoothing, r);
      };
      std::string call = torch_ce(c.logits.ndim(), c.ignore_index, c.smoothing, r);
      // Exact reference: the bf16 logits upcast, loss in f32 (ours never rounds to bf16).
      // Its gradient reaches x0 rounded once to bf16, as ours.
      check_against_torch(label + " vs f32 math", fn, "y = x0.float()\nout = " + call, {logits, labels}, {1e-5, 1e-5},
                          false);
      check_against_torch(label + " vs f32 math (grads)", fn, "y = x0.float()\nout = " + call, {logits, labels},
                          default_tolerance(DType::bf16));
      // torch's own bf16 path (log-softmax rounded to bf16) within bf16 tolerance.
      check_against_torch(label + " vs torch bf16", fn, "y = x0\nout = " + call, {logits, labels},
                          default_tolerance(DType::bf16));
    }
  }
}

TEST(LossOracle, CrossEntropyEdgeCases) {
  // Every target ignored: mean is NaN (0/0) and the gradient zero, as in torch.
  Array logits = random_normal({3, 5}, 200);
  Array all_ignored = Array::full({3}, -100, DType::i64);
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none})
    for (double ls : {0.0, 0.2})
      check_against_torch(std::string("all ignored ") + reduction_name(r) + " ls " + std::to_string(ls),
                          [&](const std::vector<Array>& in) { return cross_entropy(in[0], in[1], -100, ls, r); },
                          "out = F.cross_entropy(x0, x1, label_smoothing=" + std::to_string(ls) + ", reduction='" +
                              reduction_name(r) + "')",
                          {logits, all_ignored});
  // Large logits (overflow-safe log-sum-exp) and -inf masked classes.
  Array big = mul(random_normal({4, 9}, 201), 300.0);
  Array labels = Array::from_vector(std::vector<int64_t>{0, 3, 8, 5}, {4});
  check_against_torch("large logits", [&](const std::vector<Array>& in) { return cross_entropy(in[0], in[1]); },
                      "out = F.cross_entropy(x0, x1)", {big, labels}, {1e-4, 1e-5});
  std::vector<float> masked = random_normal({2, 6}, 202).to_floats();
  masked[1] = masked[4] = masked[7] = -INFINITY;
  Array m = Array::from_vector(masked, {2, 6});
  check_against_torch("-inf masked classes",
                      [&](const std::vector<Array>& in) { return cross_entropy(in[0], in[1], -100, 0.0); },
                      "out = F.cross_entropy(x0, x1)", {m, Array::from_vector(std::vector<int64_t>{0, 2}, {2})});
  check_against_torch(
      "-inf masked classes, smoothing",
      [&](const std::vector<Array>& in) { return cross_entropy(in[0], in[1], -100, 0.1); },
      "out = F.cross_entropy(x0, x1, label_smoothing=0.1)", {m, Array::from_vector(std::vector<int64_t>{0, 2}, {2})},
      {1e-5, 1e-5}, false);
  // 1-d logits (C,) with a 0-d label, as torch accepts.
  check_against_torch("1-d logits", [](const std::vector<Array>& in) { return cross_entropy(in[0], in[1], -100, 0.1); },
                      "out = F.cross_entropy(x0, x1, label_smoothing=0.1)",
                      {random_normal({7}, 203), Array::from_vector(std::vector<int64_t>{3}, Shape{})});
}

TEST(LossOracle, CrossEntropySecondOrder) {
  // grad_x CE is recorded (composed path under nested differentiation); its VJP is a
  // Hessian-vector product, compared with torch double backward.
  for (double ls : {0.0, 0.15}) {
    for (Reduction r : {Reduction::mean, Reduction::none}) {
      Array logits = random_normal({6, 13}, 300, DType::f32, 2.0);
      Array labels = make_labels({6}, 13, 301, -100, 4);
      Array cot = random_normal(r == Reduction::none ? Shape{6} : Shape{}, 302);
      // The cotangent is an input too: the recorded backward is linear in it.
      auto fn = [&](const std::vector<Array>& in) {
        auto f = [&](const std::vector<Array>& v) { return cross_entropy(v[0], in[1], -100, ls, r); };
        return vjp(f, {in[0]}, in[2]).second[0];
      };
      std::string code = "l = F.cross_entropy(x0, x1, label_smoothing=" + std::to_string(ls) + ", reduction='" +
                         reduction_name(r) + "')\n(out,) = torch.autograd.grad(l, x0, x2, create_graph=True)";
      std::string label = std::string("second order ls ") + std::to_string(ls) + " " + reduction_name(r);
      check_against_torch(label, fn, code, {logits, labels, cot}, {1e-5, 1e-4});
      check_finite_differences(label, fn, {logits, labels, cot});
    }
  }
  // Through value_and_grad twice: a gradient-norm penalty needs d/dx |∇CE|².
  Array logits = random_normal({4, 9}, 310);
  Array labels = make_labels({4}, 9, 311, -100, 0);
  auto penalty = [&](const std::vector<Array>& in) {
    auto f = [&](const std::vector<Array>& v) { return cross_entropy(v[0], labels, -100, 0.1); };
    Array g = vjp(f, {in[0]}, Array::scalar(1.0)).second[0];
    return sum(mul(g, g));
  };
  check_against_torch(
      "gradient penalty", penalty,
      "(g,) = torch.autograd.grad(F.cross_entropy(x0, x1, label_smoothing=0.1), x0, create_graph=True)\n"
      "out = (g * g).sum()",
      {logits, labels}, {1e-6, 1e-4});
}

TEST(LossOracle, CrossEntropyFiniteDifferences) {
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
    for (double ls : {0.0, 0.25}) {
      Array logits = random_normal({2, 5, 13}, 400);
      Array labels = make_labels({2, 5}, 13, 401, -100, 3);
      check_finite_differences(std::string("cross_entropy ") + reduction_name(r) + " ls " + std::to_string(ls),
                               [&](const std::vector<Array>& in) { return cross_entropy(in[0], labels, -100, ls, r); },
                               {logits});
    }
  }
}

// The head and its loss in one op, chunked over rows: against torch (the product, then the
// loss) and against the composed form (matmul, then cross_entropy), forward and the gradients
// of the hidden states and the weight; chunks of one row, of 4 rows (the last shorter) and
// one chunk for all; (N, C) and (B, T, C) hidden states; f32 and bf16.
TEST(LossOracle, LinearCrossEntropyMatchesTorchAndTheComposedForm) {
  const int64_t v = 257, c = 16;
  int seed = 700;
  for (const Shape& hs : {Shape{33, c}, Shape{3, 11, c}}) {
    std::vector<int64_t> lead(hs.dims().begin(), hs.dims().end() - 1);
    const std::string product = hs.ndim() == 2 ? "y = x0 @ x1.T\n" : "y = (x0 @ x1.T).permute(0, 2, 1)\n";
    for (Reduction r : {Reduction::mean, Reduction::sum}) {
      for (double ls : {0.0, 0.1}) {
        for (int64_t chunk : {int64_t(1), 4 * v, int64_t(1) << 25}) {
          ++seed;
          const Array hidden = random_normal(hs, seed, DType::f32, 2.0), weight = random_normal({v, c}, seed + 1);
          const Array labels = make_labels(Shape(lead), v, seed + 2, -100, 7);
          const std::string label = "linear_cross_entropy " + hs.str() + " " + reduction_name(r) + " ls " +
                                    std::to_string(ls) + " chunk " + std::to_string(chunk);
          auto fn = [&](const std::vector<Array>& in) {
            return linear_cross_entropy(in[0], in[1], in[2], -100, ls, r, chunk);
          };
          const std::string call = std::string(hs.ndim() == 2 ? "F.cross_entropy(y, x2.long()" : "F.cross_entropy(y, x2.long()") +
                                   ", ignore_index=-100, label_smoothing=" + std::to_string(ls) + ", reduction='" +
                                   reduction_name(r) + "')";
          // The sums' gradients reach ~10: rounding scales with them (scaled_atol).
          check_against_torch(label, fn, product + "out = " + call, {hidden, weight, labels}, {1e-5, 1e-5, 2e-6});
          auto composed = [&](const std::vector<Array>& in) {
            return cross_entropy(matmul(in[0], in[1], false, true), in[2], -100, ls, r);
          };
          const Array cot = Array::scalar(1.7);
          auto [o1, g1] = vjp(fn, {hidden, weight, labels}, cot);
          auto [o2, g2] = vjp(composed, {hidden, weight, labels}, cot);
          expect_close(o1, o2, {1e-6, 1e-6}, label + " vs composed forward");
          expect_close(g1[0], g2[0], {1e-6, 1e-5, 1e-6}, label + " vs composed d hidden");
          expect_close(g1[1], g2[1], {1e-6, 1e-5, 1e-6}, label + " vs composed d weight");
        }
      }
    }
  }
  // bf16 hidden states and weight: bf16 logits in chunks, f32 loss, the weight's gradient
  // summed over chunks in f32; within bf16 rounding of torch's f32 math and of the composed form.
  const Array hidden = random_normal({40, c}, 800, DType::bf16, 2.0), weight = random_normal({v, c}, 801, DType::bf16);
  const Array labels = make_labels({40}, v, 802, -100, 5);
  auto fn = [](const std::vector<Array>& in) {
    return linear_cross_entropy(in[0], in[1], in[2], -100, 0.0, Reduction::mean, 6 * 257);
  };
  check_against_torch("linear_cross_entropy bf16", fn, "out = F.cross_entropy(x0.float() @ x1.float().T, x2.long())",
                      {hidden, weight, labels}, default_tolerance(DType::bf16));
  auto composed = [](const std::vector<Array>& in) { return cross_entropy(matmul(in[0], in[1], false, true), in[2]); };
  auto [o1, g1] = vjp(fn, {hidden, weight, labels}, Array::scalar(1.0));
  auto [o2, g2] = vjp(composed, {hidden, weight, labels}, Array::scalar(1.0));
  EXPECT_EQ(g1[0].dtype(), DType::bf16);
  EXPECT_EQ(g1[1].dtype(), DType::bf16);
  expect_close(o1, o2, {1e-3, 1e-3}, "linear_cross_entropy bf16 vs composed forward");
  expect_close(g1[0], g2[0], default_tolerance(DType::bf16), "linear_cross_entropy bf16 vs composed d hidden");
  expect_close(g1[1], g2[1], default_tolerance(DType::bf16), "linear_cross_entropy bf16 vs composed d weight");
}

// Without a gradient to make (no trace, or a frozen weight), the op makes none and its value
// is the same; Reduction::none takes the composed form; the errors name the op and the shapes.
TEST(LossOracle, LinearCrossEntropyGradientsOnlyWhereWantedAndErrors) {
  const Array hidden = random_normal({9, 8}, 810), weight = random_normal({50, 8}, 811);
  const Array labels = make_labels({9}, 50, 812, -100, 4);
  const double full = linear_cross_entropy(hidden, weight, labels, -100, 0.0, Reduction::mean, 100).item();
  EXPECT_NEAR(full, cross_entropy(matmul(hidden, weight, false, true), labels).item(), 1e-6);
  // The weight frozen (a constant of the traced function): only the hidden states' gradient.
  auto [loss, grads] = vjp([&](const std::vector<Array>& in) {
    return linear_cross_entropy(in[0], weight, labels, -100, 0.0, Reduction::mean, 100);
  }, {hidden}, Array::scalar(1.0));
  auto [loss_ref, grads_ref] = vjp([&](const std::vector<Array>& in) {
    return cross_entropy(matmul(in[0], weight, false, true), labels);
  }, {hidden}, Array::scalar(1.0));
  EXPECT_NEAR(loss.item(), full, 1e-7);
  expect_close(grads[0], grads_ref[0], {1e-6, 1e-5}, "linear_cross_entropy frozen weight d hidden");
  const Array per_row = linear_cross_entropy(hidden, weight, labels, -100, 0.0, Reduction::none);
  expect_close(per_row, cross_entropy(matmul(hidden, weight, false, true), labels, -100, 0.0, Reduction::none),
               {1e-6, 1e-6}, "linear_cross_entropy none");
  const Array bad = Array::from_vector(std::vector<int64_t>{1, 2, 3, 50, 4, 5, 6, 7, 8}, {9});
  expect_error([&] { linear_cross_entropy(hidden, weight, bad); },
               {"[linear_cross_entropy]", "label 50", "50 classes", "flat position 3"});
  expect_error([&] { linear_cross_entropy(hidden, random_normal({50, 7}, 813), labels); },
               {"[linear_cross_entropy]", "weight must be (V, C) with C = 8", "(50, 7)"});
  expect_error([&] { linear_cross_entropy(hidden, weight, Array::zeros({8}, DType::i64)); },
               {"[linear_cross_entropy]", "labels", "(8,)", "(9,)"});
  expect_error([&] { linear_cross_entropy(hidden, cast(weight, DType::bf16), labels); },
               {"[linear_cross_entropy]", "hidden's dtype"});
}

// The vocabulary padded inside the GEMMs (on by default on a GPU; here on the CPU, to a
// multiple of 64: 257 classes become 320): the loss and the gradients equal the unpadded
// composed form's, the weight's gradient has the weight's shape, with smoothing and ignored
// rows, in chunks of 3 rows.
TEST(LossOracle, LinearCrossEntropyPaddedVocabularyKeepsTheResults) {
  struct Restore {
    ~Restore() { set_vocab_pad_multiple(false, 1); }
  } restore;
  set_vocab_pad_multiple(false, 64);
  EXPECT_EQ(vocab_pad_multiple(false), 64);
  const int64_t v = 257, c = 16;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Array hidden = random_normal({20, c}, 820, dtype, 2.0), weight = random_normal({v, c}, 821, dtype);
    const Array labels = make_labels({20}, v, 822, -100, 6);
    auto fn = [&](const std::vector<Array>& in) {
      return linear_cross_entropy(in[0], in[1], in[2], -100, 0.1, Reduction::mean, 3 * 320);
    };
    auto composed = [&](const std::vector<Array>& in) {
      return cross_entropy(matmul(in[0], in[1], false, true), in[2], -100, 0.1);
    };
    auto [o1, g1] = vjp(fn, {hidden, weight, labels}, Array::scalar(1.0));
    auto [o2, g2] = vjp(composed, {hidden, weight, labels}, Array::scalar(1.0));
    const std::string label = std::string("linear_cross_entropy padded 257 -> 320 ") + dtype_name(dtype);
    const Tolerance tol = dtype == DType::f32 ? Tolerance{1e-6, 1e-5, 1e-6} : default_tolerance(dtype);
    ASSERT_EQ(g1[1].shape(), weight.shape());
    // bf16 logits from GEMMs of other shapes may round differently.
    expect_close(o1, o2, dtype == DType::f32 ? Tolerance{1e-6, 1e-6} : Tolerance{1e-3, 1e-3}, label + " forward");
    expect_close(g1[0], g2[0], tol, label + " d hidden");
    expect_close(g1[1], g2[1], tol, label + " d weight");
  }
  expect_error([] { set_vocab_pad_multiple(false, 0); }, {"[linear_cross_entropy]", "pad multiple", "0"});
}

TEST(LossOracle, MseLossMatchesTorch) {
  const Shape shapes[] = {{7, 13}, {3, 1, 5}, {1}, {}, {129, 65}};
  int seed = 500;
  for (const Shape& s : shapes) {
    for (DType dt : {DType::f32, DType::bf16}) {
      for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
        ++seed;
        Array pred = random_normal(s, seed, dt), target = random_normal(s, seed + 1000, dt);
        std::string label = "mse_loss " + s.str() + " " + reduction_name(r) + "/" + dtype_name(dt);
        // torch 1.13 has no CPU bf16 mse_loss: its reference is f32 math rounded to bf16.
        check_against_torch(
            label, [&](const std::vector<Array>& in) { return mse_loss(in[0], in[1], r); },
            std::string("out = F.mse_loss(x0.float(), x1.float(), reduction='") + reduction_name(r) + "').to(x0.dtype)",
            {pred, target}, default_tolerance(dt));
      }
    }
  }
  check_finite_differences("mse_loss", [](const std::vector<Array>& in) { return mse_loss(in[0], in[1]); },
                           {random_normal({4, 6}, 600), random_normal({4, 6}, 601)});
}

TEST(LossErrors, NameLabelsAndShapes) {
  Array logits = Array::zeros({4, 1000});
  Array bad = Array::from_vector(std::vector<int64_t>{1, 1000, 2, 3}, {4});
  expect_error([&] { cross_entropy(logits, bad); }, {"[cross_entropy]", "label 1000", "1000 classes", "(4, 1000)"});
  Array neg = Array::from_vector(std::vector<int64_t>{1, -5, 2, 3}, {4});
  expect_error([&] { cross_entropy(logits, neg); }, {"[cross_entropy]", "label -5", "1000 classes"});
  // -5 is fine when it is the ignore_index.
  EXPECT_NO_THROW(cross_entropy(logits, neg, -5));
  expect_error([&] { cross_entropy(logits, Array::zeros({5}, DType::i64)); }, {"[cross_entropy]", "(4,)", "(4, 1000)"});
  expect_error([&] { cross_entropy(logits, Array::zeros({4})); }, {"[cross_entropy]", "i32 or i64", "f32(4,)"});
  expect_error([&] { cross_entropy(Array::zeros({4, 10}, DType::i64), bad); }, {"[cross_entropy]", "floating"});
  expect_error([&] { cross_entropy(logits, neg, -5, 1.5); }, {"[cross_entropy]", "label_smoothing 1.5"});
  expect_error([&] { cross_entropy_reference(logits, bad); }, {"[cross_entropy_reference]", "label 1000"});
  expect_error([&] { mse_loss(Array::zeros({2, 3}), Array::zeros({3, 2})); }, {"[mse_loss]", "(2, 3)", "(3, 2)"});
  expect_error([&] { mse_loss(Array::zeros({2}), Array::zeros({2}, DType::i64)); }, {"[mse_loss]", "i64"});
  // Mixed float dtypes (a bf16 model's predictions, f32 targets) compute and return f32.
  const Array pred = Array::from_vector(std::vector<float>{0.5f, 2.0f}, {2}), target = Array::from_vector(std::vector<float>{1.0f, 1.0f}, {2});
  const Array mixed = mse_loss(cast(pred, DType::bf16), target);
  EXPECT_EQ(mixed.dtype(), DType::f32);
  EXPECT_FLOAT_EQ(float(mixed.item()), (0.25f + 1.0f) / 2);
}

}  // namespace
}  // namespace mt::testing
