// Reductions (sum, mean, max, min, logsumexp, argmax) and shape ops (reshape, transpose,
// slice, concatenate, stack, split, broadcast, expand/squeeze) against PyTorch, plus
// finite-difference checks of their VJPs and error messages for bad input.
#include <gtest/gtest.h>

#include <sstream>

#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

// "(0, 2)" style Python tuple of ints.
template <class T>
std::string py_tuple(const std::vector<T>& v) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < v.size(); ++i) os << v[i] << (v.size() == 1 || i + 1 < v.size() ? "," : "");
  os << ")";
  return os.str();
}

std::string axes_label(const std::vector<int>& axes, bool keepdims) {
  std::ostringstream os;
  os << "axes" << (axes.empty() ? std::string("=all") : py_tuple(axes)) << (keepdims ? " keep" : "");
  return os.str();
}

// Torch's `dim=` argument: our empty list means every axis.
std::string torch_dims(const std::vector<int>& axes, int ndim) {
  if (!axes.empty()) return py_tuple(axes);
  std::vector<int> all;
  for (int i = 0; i < ndim; ++i) all.push_back(i);
  return py_tuple(all);
}


using ReduceFn = Array (*)(const Array&, std::vector<int>, bool);

struct ReduceCase {
  const char* name;
  ReduceFn fn;
  const char* torch_fn;  // called as torch_fn(x0, dim=..., keepdim=...)
};

const ReduceCase kReductions[] = {
    {"sum", sum, "torch.sum"},
    {"mean", mean, "torch.mean"},
    {"max", max, "torch.amax"},
    {"min", min, "torch.amin"},
    {"logsumexp", logsumexp, "torch.logsumexp"},
};

// Single, multiple, non-contiguous, negative and all axes on a 3-d and a 4-d input.
const std::vector<std::pair<Shape, std::vector<int>>> kReduceAxes = {
    {{5, 7, 3}, {1}},     {{5, 7, 3}, {0}},         {{5, 7, 3}, {2}},       {{5, 7, 3}, {-1}},
    {{5, 7, 3}, {0, 1}},  {{5, 7, 3}, {0, 2}},      {{5, 7, 3}, {2, -3}},   {{5, 7, 3}, {}},
    {{3, 4, 5, 2}, {1, 3}}, {{3, 4, 5, 2}, {-1, 0, 2}}, {{3, 4, 5, 2}, {1, 2}}, {{13}, {0}},
};

TEST(ReduceOracle, AxesKeepdimsF32AndBf16) {
  for (const auto& c : kReductions) {
    for (const auto& [shape, axes] : kReduceAxes) {
      for (bool keep : {false, true}) {
        for (DType dt : {DType::f32, DType::bf16}) {
          Array x = random_normal(shape, 101 + shape.ndim(), dt, 2.0);
          std::string code = std::string("out = ") + c.torch_fn + "(x0, dim=" + torch_dims(axes, shape.ndim()) +
                             ", keepdim=" + (keep ? "True" : "False") + ")";
          auto fn = [&](const std::vector<Array>& in) { return c.fn(in[0], axes, keep); };
          check_against_torch(std::string(c.name) + " " + shape.str() + " " + axes_label(axes, keep) + "/" +
                                  dtype_name(dt),
                              fn, code, {x}, default_tolerance(dt));
        }
      }
    }
  }
}

TEST(ReduceOracle, FiniteDifferences) {
  for (const auto& c : kReductions) {
    for (const auto& [shape, axes] : kReduceAxes) {
      Array x = random_normal(shape, 202, DType::f32);
      check_finite_differences(std::string(c.name) + " " + shape.str() + " " + axes_label(axes, false),
                               [&](const std::vector<Array>& in) { return c.fn(in[0], axes, false); }, {x});
    }
  }
}

TEST(ReduceOracle, IntegerAndBoolSums) {
  Array xi = random_ints({4, 6}, 7, -50, 50, DType::i32);
  check_against_torch("sum i32 -> i64", [](const std::vector<Array>& in) { return sum(in[0], {1}); },
                      "out = torch.sum(x0, dim=1)", {xi});
  Array xl = random_ints({4, 6}, 8, -50, 50, DType::i64);
  check_against_torch("max i64", [](const std::vector<Array>& in) { return max(in[0], {0}); },
                      "out = torch.amax(x0, dim=0)", {xl});
  Array xb = gt(random_normal({5, 3}, 9), Array::scalar(0.0));
  check_against_torch("sum bool", [](const std::vector<Array>& in) { return sum(in[0]); }, "out = torch.sum(x0)",
                      {xb});
}

TEST(ReduceOracle, MaxMinTiesSplitGradient) {
  // Rows with two or three tied extrema: the gradient is shared evenly (torch.amax).
  Array x = Array::from_vector(std::vector<float>{3, 1, 3, 0, 2, 2, 2, -1, -5, 4, -5, 4}, {3, 4});
  for (int axis : {0, 1}) {
    check_against_torch("max ties axis " + std::to_string(axis),
                        [axis](const std::vector<Array>& in) { return max(in[0], {axis}); },
                        "out = torch.amax(x0, dim=" + std::to_string(axis) + ")", {x});
    check_against_torch("min ties axis " + std::to_string(axis),
                        [axis](const std::vector<Array>& in) { return min(in[0], {axis}); },
                        "out = torch.amin(x0, dim=" + std::to_string(axis) + ")", {x});
  }
  check_against_torch("max ties all", [](const std::vector<Array>& in) { return max(in[0]); },
                      "out = torch.amax(x0)", {x});
  Array xb = cast(x, DType::bf16);
  check_against_torch("max ties bf16", [](const std::vector<Array>& in) { return max(in[0], {1}, true); },
                      "out = torch.amax(x0, dim=1, keepdim=True)", {xb}, default_tolerance(DType::bf16));
}

TEST(ReduceOracle, LogsumexpLargeAndInfinite) {
  // Large magnitudes must not overflow; -inf rows give -inf like torch.
  Array big = random_normal({4, 9}, 31, DType::f32, 300.0);
  check_against_torch("logsumexp large", [](const std::vector<Array>& in) { return logsumexp(in[0], {1}); },
                      "out = torch.logsumexp(x0, dim=1)", {big}, {1e-4, 1e-5});
  Array inf = Array::from_vector(std::vector<float>{-INFINITY, -INFINITY, -INFINITY, 1, 2, -INFINITY}, {2, 3});
  check_against_torch("logsumexp -inf row", [](const std::vector<Array>& in) { return logsumexp(in[0], {1}); },
                      "out = torch.logsumexp(x0, dim=1)", {inf}, {}, /*check_grads=*/false);
}

TEST(ReduceOracle, ArgmaxIncludingTies) {
  Array x = random_normal({4, 7, 5}, 41);
  for (int axis : {0, 1, 2, -1}) {
    for (bool keep : {false, true}) {
      std::string code = "out = torch.argmax(x0, dim=" + std::to_string(axis) + ", keepdim=" + (keep ? "True" : "False") +
                         ")";
      check_against_torch("argmax axis " + std::to_string(axis) + (keep ? " keep" : ""),
                          [axis, keep](const std::vector<Array>& in) { return argmax(in[0], axis, keep); }, code, {x});
    }
  }
  // Ties resolve to the first index; also in bf16, where distinct f32 values collide.
  Array ties = Array::from_vector(std::vector<float>{1, 5, 5, 2, 7, 7, 7, 7, -1, -1, -3, -1}, {3, 4});
  check_against_torch("argmax ties", [](const std::vector<Array>& in) { return argmax(in[0], 1); },
                      "out = torch.argmax(x0, dim=1)", {ties});
  check_against_torch("argmax ties axis 0", [](const std::vector<Array>& in) { return argmax(in[0], 0); },
                      "out = torch.argmax(x0, dim=0)", {ties});
  EXPECT_EQ(argmax(ties, 1).to_ints(), (std::vector<int64_t>{1, 0, 0}));
  Array bf = Array::from_vector(std::vector<float>{1.0f, 1.001f, 1.002f, 0.5f}, {4}, DType::bf16);
  EXPECT_EQ(argmax(bf, 0).item(), 0.0);  // all three round to 1.0 in bf16
  Array ints = random_ints({6, 5}, 43, 0, 3, DType::i64);  // many ties
  check_against_torch("argmax i64 ties", [](const std::vector<Array>& in) { return argmax(in[0], 0); },
                      "out = torch.argmax(x0, dim=0)", {ints});
}

TEST(ReduceErrors, NameOpAndShapes) {
  Array x = Array::zeros({2, 3});
  expect_error([&] { sum(x, {2}); }, {"[sum]", "axis 2", "(2, 3)"});
  expect_error([&] { sum(x, {1, -1}); }, {"[sum]", "repeated axis", "(2, 3)"});
  expect_error([&] { mean(Array::zeros({2}, DType::i64)); }, {"[mean]", "i64"});
  expect_error([&] { max(Array::zeros({2, 0}), {1}); }, {"[max]", "empty axis", "(2, 0)"});
  expect_error([&] { argmax(Array::zeros({0, 3}), 0); }, {"[argmax]", "(0, 3)"});
  expect_error([&] { argmax(x, -3); }, {"[argmax]", "axis -3", "(2, 3)"});
  expect_error([&] { logsumexp(Array::zeros({2}, DType::i32)); }, {"[logsumexp]", "i32"});
}

// ---------------------------------------------------------------------------------
// Shape ops

TEST(ShapeOracle, Reshape) {
  Array x = random_normal({4, 3, 5}, 51);
  const std::vector<std::vector<int64_t>> targets = {{12, 5}, {-1, 5}, {4, -1}, {60}, {-1}, {2, 2, 15, 1}, {3, -1, 2}};
  for (const auto& t : targets) {
    for (DType dt : {DType::f32, DType::bf16}) {
      Array xd = cast(x, dt);
      check_against_torch("reshape to " + py_tuple(t) + "/" + dtype_name(dt),
                          [t](const std::vector<Array>& in) { return reshape(in[0], t); },
                          "out = x0.reshape(" + py_tuple(t) + ")", {xd}, default_tolerance(dt));
    }
    check_finite_differences("reshape " + py_tuple(t), [t](const std::vector<Array>& in) { return reshape(in[0], t); },
                             {x});
  }
  Array s = reshape(Array::scalar(3.0), {1, 1});
  EXPECT_EQ(s.shape(), (Shape{1, 1}));
  EXPECT_EQ(reshape(s, {}).item(), 3.0);
}

TEST(ShapeOracle, TransposeAndSwapAxes) {
  const std::vector<std::pair<Shape, std::vector<int>>> cases = {
      {{3, 4, 5}, {2, 0, 1}},       {{3, 4, 5}, {1, 0, 2}},       {{3, 4, 5}, {0, 2, 1}},
      {{3, 4, 5}, {2, 1, 0}},       {{3, 4, 5}, {-1, 0, -2}},     {{2, 3, 4, 5}, {0, 2, 1, 3}},
      {{2, 3, 4, 5}, {3, 2, 1, 0}}, {{2, 3, 4, 5}, {1, 3, 0, 2}}, {{2, 1, 4, 1}, {3, 2, 0, 1}},
      {{7, 9}, {1, 0}},
  };
  for (const auto& [shape, perm] : cases) {
    for (DType dt : {DType::f32, DType::bf16}) {
      Array x = random_normal(shape, 61, dt);
      std::vector<int> p = perm;
      for (int& a : p) a = a < 0 ? a + shape.ndim() : a;  // torch.permute wants what our transpose normalizes
      check_against_torch("transpose " + shape.str() + " " + py_tuple(perm) + "/" + dtype_name(dt),
                          [perm](const std::vector<Array>& in) { return transpose(in[0], perm); },
                          "out = x0.permute" + py_tuple(p), {x}, default_tolerance(dt));
    }
    Array x = random_normal(shape, 62);
    check_finite_differences("transpose " + py_tuple(perm),
                             [perm](const std::vector<Array>& in) { return transpose(in[0], perm); }, {x});
  }
  Array big = random_normal({64, 33, 41}, 63);  // large enough for the parallel copy path
  check_against_torch("transpose large", [](const std::vector<Array>& in) { return transpose(in[0], {2, 0, 1}); },
                      "out = x0.permute(2, 0, 1)", {big});
  Array x4 = random_normal({2, 3, 4, 5}, 64);
  for (auto [a, b] : std::vector<std::pair<int, int>>{{1, 2}, {-1, -2}, {0, 3}, {2, 2}}) {
    std::string label = "swap_axes " + std::to_string(a) + "," + std::to_string(b);
    check_against_torch(label, [a = a, b = b](const std::vector<Array>& in) { return swap_axes(in[0], a, b); },
                        "out = x0.transpose(" + std::to_string(a) + ", " + std::to_string(b) + ")", {x4});
    check_finite_differences(label, [a = a, b = b](const std::vector<Array>& in) { return swap_axes(in[0], a, b); },
                             {x4});
  }
  Array ints = random_ints({3, 4}, 65, 0, 100, DType::i32);
  check_against_torch("transpose i32", [](const std::vector<Array>& in) { return transpose(in[0], {1, 0}); },
                      "out = x0.t()", {ints});
}

TEST(ShapeOracle, Slice) {
  Array x = random_normal({6, 7, 5}, 71);
  struct Case {
    int axis;
    int64_t start, stop;
    const char* py;  // the same slice in Python
  };
  const Case cases[] = {
      {0, 1, 4, "x0[1:4]"},           {1, 2, 7, "x0[:, 2:7]"},       {2, 0, 1, "x0[:, :, 0:1]"},
      {-1, -3, -1, "x0[..., -3:-1]"}, {1, -4, 6, "x0[:, -4:6]"},      {0, -100, 2, "x0[-100:2]"},
      {1, 3, 100, "x0[:, 3:100]"},    {2, 4, 2, "x0[:, :, 4:2]"},     {-2, 0, -1, "x0[:, 0:-1]"},
      {0, 5, 6, "x0[5:6]"},
  };
  for (const auto& c : cases) {
    std::string label = std::string("slice ") + c.py;
    auto fn = [c](const std::vector<Array>& in) { return slice(in[0], c.axis, c.start, c.stop); };
    for (DType dt : {DType::f32, DType::bf16})
      check_against_torch(label + "/" + dtype_name(dt), fn, std::string("out = ") + c.py, {cast(x, dt)},
                          default_tolerance(dt));
    if (fn({x}).numel() > 0) check_finite_differences(label, fn, {x});
  }
}

TEST(ShapeOracle, ConcatenateStackSplit) {
  for (int axis : {0, 1, 2, -1, -2}) {
    // Inputs that differ only along `axis` (sizes 2, 1, 3).
    int a = axis < 0 ? axis + 3 : axis;
    std::vector<Array> xs;
    for (int64_t n : {2, 1, 3}) {
      std::vector<int64_t> dims = {4, 5, 3};
      dims[size_t(a)] = n;
      xs.push_back(random_normal(Shape(dims), 80 + uint64_t(n)));
    }
    std::string ax = std::to_string(axis);
    auto cat = [axis](const std::vector<Array>& in) { return concatenate(in, axis); };
    for (DType dt : {DType::f32, DType::bf16}) {
      std::vector<Array> xd;
      for (const Array& x : xs) xd.push_back(cast(x, dt));
      check_against_torch("concatenate axis " + ax + "/" + dtype_name(dt), cat,
                          "out = torch.cat(xs, dim=" + ax + ")", xd, default_tolerance(dt));
    }
    check_finite_differences("concatenate axis " + ax, cat, xs);

    Array y = concatenate(xs, axis);
    std::vector<int64_t> sizes = {2, 1, 3};
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::string label = "split axis " + ax + " piece " + std::to_string(k);
      auto fn = [sizes, axis, k](const std::vector<Array>& in) { return split(in[0], sizes, axis)[k]; };
      check_against_torch(label, fn, "out = torch.split(x0, [2, 1, 3], dim=" + ax + ")[" + std::to_string(k) + "]",
                          {y});
      check_finite_differences(label, fn, {y});
    }
  }
  std::vector<Array> same = {random_normal({3, 4}, 91), random_normal({3, 4}, 92), random_normal({3, 4}, 93)};
  for (int axis : {0, 1, 2, -1, -3}) {
    std::string ax = std::to_string(axis);
    auto fn = [axis](const std::vector<Array>& in) { return stack(in, axis); };
    check_against_torch("stack axis " + ax, fn, "out = torch.stack(xs, dim=" + ax + ")", same);
    check_finite_differences("stack axis " + ax, fn, same);
  }
  std::vector<Array> same_bf;
  for (const Array& x : same) same_bf.push_back(cast(x, DType::bf16));
  check_against_torch("stack bf16", [](const std::vector<Array>& in) { return stack(in, 1); },
                      "out = torch.stack(xs, dim=1)", same_bf, default_tolerance(DType::bf16));
  // A zero-size piece is allowed, as in torch.split.
  auto pieces = split(random_normal({5, 2}, 94), {0, 5}, 0);
  EXPECT_EQ(pieces[0].shape(), (Shape{0, 2}));
  EXPECT_EQ(pieces[1].shape(), (Shape{5, 2}));
}

TEST(ShapeOracle, BroadcastExpandSqueeze) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 1}, {3, 4}}, {{1, 4}, {2, 3, 4}}, {{}, {2, 5}}, {{5}, {3, 2, 5}}, {{2, 1, 3, 1}, {2, 4, 3, 5}}, {{3}, {3}}};
  for (const auto& [from, to] : cases) {
    std::vector<int64_t> dims = to.dims();
    auto fn = [to = to](const std::vector<Array>& in) { return broadcast_to(in[0], to); };
    for (DType dt : {DType::f32, DType::bf16}) {
      Array x = random_normal(from, 101, dt);
      check_against_torch("broadcast_to " + from.str() + "->" + to.str() + "/" + dtype_name(dt), fn,
                          "out = torch.broadcast_to(x0, " + py_tuple(dims) + ")", {x}, default_tolerance(dt));
    }
    check_finite_differences("broadcast_to " + from.str() + "->" + to.str(), fn, {random_normal(from, 102)});
  }
  Array x = random_normal({3, 4}, 103);
  for (int axis : {0, 1, 2, -1, -2, -3}) {
    std::string ax = std::to_string(axis);
    auto fn = [axis](const std::vector<Array>& in) { return expand_dims(in[0], axis); };
    check_against_torch("expand_dims " + ax, fn, "out = x0.unsqueeze(" + ax + ")", {x});
    check_finite_differences("expand_dims " + ax, fn, {x});
  }
  Array y = random_normal({3, 1, 4, 1}, 104);
  for (int axis : {1, 3, -1, -3}) {
    std::string ax = std::to_string(axis);
    auto fn = [axis](const std::vector<Array>& in) { return squeeze(in[0], axis); };
    for (DType dt : {DType::f32, DType::bf16})
      check_against_torch("squeeze " + ax + "/" + dtype_name(dt), fn, "out = x0.squeeze(" + ax + ")", {cast(y, dt)},
                          default_tolerance(dt));
    check_finite_differences("squeeze " + ax, fn, {y});
  }
}

TEST(ShapeOracle, ComposedChain) {
  // Several shape ops in a row followed by a reduction, as model code chains them.
  Array x = random_normal({2, 6, 4}, 111);
  auto fn = [](const std::vector<Array>& in) {
    Array h = reshape(in[0], {2, 6, 2, 2});
    h = transpose(h, {0, 2, 1, 3});
    h = slice(h, 2, 1, -1);
    h = concatenate({h, h}, -1);
    return logsumexp(h, {1, 3});
  };
  check_against_torch("chain", fn,
                      "h = x0.reshape(2, 6, 2, 2).permute(0, 2, 1, 3)[:, :, 1:-1]\n"
                      "h = torch.cat([h, h], dim=-1)\nout = torch.logsumexp(h, dim=(1, 3))",
                      {x});
  check_finite_differences("chain", fn, {x});
}

TEST(ShapeErrors, NameOpAndShapes) {
  Array x = Array::zeros({2, 3});
  expect_error([&] { reshape(x, {4, 2}); }, {"[reshape]", "(2, 3)", "(4, 2)"});
  expect_error([&] { reshape(x, {-1, -1}); }, {"[reshape]", "more than one -1"});
  expect_error([&] { reshape(x, {4, -1}); }, {"[reshape]", "(2, 3)"});
  expect_error([&] { transpose(x, {0}); }, {"[transpose]", "(2, 3)"});
  expect_error([&] { transpose(x, {1, 1}); }, {"[transpose]", "repeated", "(2, 3)"});
  expect_error([&] { transpose(x, {0, 2}); }, {"[transpose]", "axis 2", "(2, 3)"});
  expect_error([&] { swap_axes(x, 0, 5); }, {"[swap_axes]", "axis 5", "(2, 3)"});
  expect_error([&] { slice(x, 2, 0, 1); }, {"[slice]", "(2, 3)"});
  expect_error([&] { concatenate({x, Array::zeros({3, 3})}, 1); }, {"[concatenate]", "(2, 3)", "(3, 3)"});
  expect_error([&] { concatenate({x, Array::zeros({2, 3}, DType::bf16)}, 0); }, {"[concatenate]", "bf16"});
  expect_error([&] { concatenate({x, Array::zeros({2})}, 0); }, {"[concatenate]", "rank", "(2,)"});
  expect_error([&] { concatenate({}, 0); }, {"[concatenate]"});
  expect_error([&] { stack({x, Array::zeros({3, 2})}, 0); }, {"[stack]", "(2, 3)", "(3, 2)"});
  expect_error([&] { stack({x, x}, 3); }, {"[expand_dims]", "axis 3"});
  expect_error([&] { split(x, {1, 1}, 1); }, {"[split]", "sum to 2", "(2, 3)"});
  expect_error([&] { split(x, {-1, 4}, 1); }, {"[split]", "negative", "(2, 3)"});
  expect_error([&] { broadcast_to(x, Shape{3, 3}); }, {"[broadcast_to]", "(2, 3)", "(3, 3)"});
  expect_error([&] { broadcast_to(x, Shape{3}); }, {"[broadcast_to]", "(2, 3)", "(3,)"});
  expect_error([&] { squeeze(x, 0); }, {"[squeeze]", "(2, 3)"});
  expect_error([&] { expand_dims(x, -4); }, {"[expand_dims]", "(2, 3)"});
  expect_error([&] { pad_into(Array::zeros({2, 2}), Shape{2, 3}, 1, 2); }, {"[pad_into]", "(2, 2)", "(2, 3)"});
  expect_error([&] { pad_into(Array::zeros({2, 2}), Shape{3, 3}, 1, 0); }, {"[pad_into]", "(2, 2)", "(3, 3)"});
  expect_error([&] { sum_to(x, Shape{2, 2, 3}); }, {"[sum_to]", "(2, 3)", "(2, 2, 3)"});
  // Undefined handles are reported, not dereferenced.
  for (auto fn : std::vector<std::function<void()>>{[] { transpose(Array(), {}); },
                                                      [] { swap_axes(Array(), 0, 1); },
                                                      [] { split(Array(), {1}, 0); },
                                                      [] { expand_dims(Array(), 0); },
                                                      [] { squeeze(Array(), 0); },
                                                      [] { concatenate({Array()}, 0); },
                                                      [] { sum(Array()); },
                                                      [] { argmax(Array(), 0); }})
    EXPECT_THROW(fn(), Error);
}

}  // namespace
}  // namespace mt::testing
