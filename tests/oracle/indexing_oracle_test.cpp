// Gathers, scatters, embedding, one_hot and top_k against PyTorch (f32, bf16, i32/i64
// indices, repeated indices, odd and parallel-sized shapes), finite differences of every
// VJP and of the VJP's own VJP, race-freedom of the embedding backward, and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

// bf16 references are computed in f32 by torch and rounded once, as our kernels do
// (torch's own bf16 index_add rounds after every addition).
std::string f32_ref(const std::string& expr) { return "y = x0.float()\nout = (" + expr + ").to(x0.dtype)"; }


struct TakeCase {
  Shape x, idx;
  int axis;
  const char* torch;  // in terms of y (x0 as f32) and x1 (indices)
};

TEST(IndexingOracle, TakeMatchesIndexSelect) {
  const TakeCase cases[] = {
      {{5, 7, 3}, {4}, 1, "torch.index_select(y, 1, x1.long())"},
      {{6, 5}, {2, 3}, 0, "y[x1.long()]"},
      {{4, 9, 5}, {3, 2}, 1, "y[:, x1.long()]"},
      {{4, 9, 5}, {7}, -1, "y[..., x1.long()]"},
      {{11}, {}, 0, "y[x1.long()]"},
      {{3, 0, 2}, {0}, 1, "y[:, x1.long()]"},
      {{64, 257, 9}, {211}, 1, "torch.index_select(y, 1, x1.long())"},  // parallel path
  };
  int seed = 0;
  for (const TakeCase& c : cases) {
    for (DType dt : {DType::f32, DType::bf16}) {
      const int axis = c.x.axis(c.axis, "test");
      DType it = (seed++ % 2) ? DType::i32 : DType::i64;
      Array x = random_normal(c.x, 100 + seed, dt);
      Array idx = c.x[axis] == 0 ? Array::zeros(c.idx, it) : random_ints(c.idx, 200 + seed, 0, c.x[axis], it);
      std::string label = "take " + c.x.str() + "[" + c.idx.str() + " " + dtype_name(it) + "] axis " +
                          std::to_string(c.axis) + "/" + dtype_name(dt);
      check_against_torch(
          label, [&](const std::vector<Array>& in) { return take(in[0], in[1], c.axis); }, f32_ref(c.torch), {x, idx},
          default_tolerance(dt));
    }
  }
}

TEST(IndexingOracle, ScatterAddMatchesIndexAdd) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Array upd = random_normal({6, 9, 4}, 1, dt);
    Array idx = random_ints({9}, 2, 0, 5, DType::i64);  // 9 indices into 5 rows: repeats
    check_against_torch(
        std::string("scatter_add axis 1/") + dtype_name(dt),
        [&](const std::vector<Array>& in) {
          return scatter_add({6, 5, 4}, in[1], in[0], 1);
        },
        f32_ref("torch.zeros(6, 5, 4).index_add(1, x1.long(), y)"), {upd, idx}, default_tolerance(dt));
    // 2-d indices, heavy repeats, big enough for the parallel path.
    Array upd2 = random_normal({40, 50, 64}, 3, dt);
    Array idx2 = random_ints({40, 50}, 4, 0, 30, DType::i32);
    check_against_torch(
        std::string("scatter_add 2-d indices/") + dtype_name(dt),
        [&](const std::vector<Array>& in) {
          return scatter_add({300, 64}, in[1], in[0], 0);
        },
        f32_ref("torch.zeros(300, 64).index_add(0, x1.reshape(-1).long(), y.reshape(-1, 64))"), {upd2, idx2},
        default_tolerance(dt));
  }
  // Integer updates sum exactly.
  Array iu = random_ints({7, 3}, 5, -50, 50, DType::i64);
  Array ii = random_ints({7}, 6, 0, 4, DType::i64);
  check_against_torch("scatter_add i64",
                      [&](const std::vector<Array>& in) {
                        return scatter_add({4, 3}, in[1], in[0], 0);
                      },
                      "out = torch.zeros(4, 3, dtype=torch.int64).index_add(0, x1, x0)", {iu, ii});
}

struct AlongCase {
  Shape x, idx;
  int axis;
};

TEST(IndexingOracle, TakeAlongAxisMatchesGather) {
  const AlongCase cases[] = {
      {{4, 6, 5}, {4, 3, 5}, 1},      {{4, 6, 5}, {3, 8, 2}, 1},       {{7, 5}, {2, 5}, 0},
      {{3, 4, 130}, {3, 4, 300}, -1}, {{50, 40, 33}, {50, 60, 33}, 1}, {{9}, {13}, 0},
  };
  int seed = 0;
  for (const AlongCase& c : cases) {
    for (DType dt : {DType::f32, DType::bf16}) {
      ++seed;
      const int axis = c.x.axis(c.axis, "test");
      Array x = random_normal(c.x, 300 + seed, dt);
      Array idx = random_ints(c.idx, 400 + seed, 0, c.x[axis], seed % 2 ? DType::i32 : DType::i64);
      std::string ax = std::to_string(axis);
      std::string label = "take_along_axis " + c.x.str() + " idx " + c.idx.str() + " axis " + ax + "/" + dtype_name(dt);
      check_against_torch(
          label, [&](const std::vector<Array>& in) { return take_along_axis(in[0], in[1], c.axis); },
          f32_ref("torch.gather(y, " + ax + ", x1.long())"), {x, idx}, default_tolerance(dt));
      // The adjoint directly: torch.scatter_add into zeros.
      Array upd = random_normal(c.idx, 500 + seed, dt);
      std::string zeros = "torch.zeros(" + c.x.str() + ")";
      check_against_torch(
          "scatter_add_along_axis " + c.x.str() + " idx " + c.idx.str() + "/" + dtype_name(dt),
          [&](const std::vector<Array>& in) { return scatter_add_along_axis(c.x, in[1], in[0], c.axis); },
          f32_ref(zeros + ".scatter_add(" + ax + ", x1.long(), y)"), {upd, idx}, default_tolerance(dt));
    }
  }
}

TEST(IndexingOracle, EmbeddingMatchesTorch) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Array table = random_normal({1000, 33}, 7, dt);
    Array ids = random_ints({4, 17}, 8, 0, 1000, DType::i64);
    check_against_torch(
        std::string("embedding (1000, 33)/") + dtype_name(dt),
        [](const std::vector<Array>& in) { return embedding(in[0], in[1]); }, f32_ref("F.embedding(x1.long(), y)"),
        {table, ids}, default_tolerance(dt));
    // Many repeats of few ids, parallel backward.
    Array table2 = random_normal({500, 64}, 9, dt);
    Array ids2 = random_ints({64, 128}, 10, 0, 20, DType::i32);
    check_against_torch(
        std::string("embedding repeats (500, 64)/") + dtype_name(dt),
        [](const std::vector<Array>& in) { return embedding(in[0], in[1]); }, f32_ref("F.embedding(x1.long(), y)"),
        {table2, ids2}, default_tolerance(dt));
  }
  // 1-d and 0-d ids.
  Array table = random_normal({10, 3}, 11);
  check_against_torch("embedding 1-d ids", [](const std::vector<Array>& in) { return embedding(in[0], in[1]); },
                      "out = F.embedding(x1, x0)", {table, random_ints({5}, 12, 0, 10)});
  Array scalar_id = Array::from_vector(std::vector<int64_t>{4}, Shape{});
  check_against_torch("embedding 0-d id", [&](const std::vector<Array>& in) { return embedding(in[0], scalar_id); },
                      "out = x0[4]", {table});
}

TEST(IndexingOracle, EmbeddingBackwardIsRaceFreeAndDeterministic) {
  // Every token hits one of 3 rows: threads would collide without row ownership.
  const int64_t v = 50, d = 96;
  Array table = random_normal({v, d}, 13);
  Array ids = random_ints({256, 64}, 14, 0, 3, DType::i64);
  Array cot = random_normal({256, 64, d}, 15);
  auto fn = [&](const std::vector<Array>& in) { return embedding(in[0], ids); };
  Array g1 = vjp(fn, {table}, cot).second[0];
  Array g2 = vjp(fn, {table}, cot).second[0];
  EXPECT_EQ(g1.to_floats(), g2.to_floats());
  // Serial f32 accumulation in token order: our kernel sums each row in the same order.
  std::vector<float> ref(size_t(v * d), 0.0f);
  std::vector<int64_t> iv = ids.to_ints();
  std::vector<float> cv = cot.to_floats();
  for (size_t t = 0; t < iv.size(); ++t)
    for (int64_t k = 0; k < d; ++k) ref[size_t(iv[t] * d + k)] += cv[t * size_t(d) + size_t(k)];
  EXPECT_EQ(g1.to_floats(), ref);
}

TEST(IndexingOracle, OneHotMatchesTorch) {
  Array ids = random_ints({3, 5}, 16, 0, 7, DType::i64);
  check_against_torch("one_hot f32", [](const std::vector<Array>& in) { return one_hot(in[0], 7); },
                      "out = F.one_hot(x0, 7).float()", {ids});
  check_against_torch("one_hot i64 (i32 ids)",
                      [](const std::vector<Array>& in) { return one_hot(in[0], 7, DType::i64); },
                      "out = F.one_hot(x0.long(), 7)", {cast(ids, DType::i32)});
  check_against_torch("one_hot bf16 1-d",
                      [](const std::vector<Array>& in) { return one_hot(in[0], 1000, DType::bf16); },
                      "out = F.one_hot(x0, 1000).bfloat16()", {random_ints({37}, 17, 0, 1000)});
  check_against_torch("one_hot bool", [](const std::vector<Array>& in) { return one_hot(in[0], 4, DType::boolean); },
                      "out = F.one_hot(x0, 4).bool()", {random_ints({2, 3, 2}, 18, 0, 4)});
}

// Values without ties along `axis` (torch.topk leaves the order of ties unspecified):
// each line is a shuffled 0..A-1 mapped to (v - 128) / 16, exact in bf16 for A <= 256.
Array distinct_values(const Shape& shape, int axis, uint64_t seed, DType dt) {
  axis = shape.axis(axis, "test");
  const int n = shape.ndim();
  const int64_t a = shape[axis], lines = a == 0 ? 0 : shape.numel() / a;
  std::vector<int64_t> moved;
  for (int d = 0; d < n; ++d)
    if (d != axis) moved.push_back(shape[d]);
  moved.push_back(a);
  std::vector<double> v;
  std::mt19937_64 gen(seed);
  for (int64_t l = 0; l < lines; ++l) {
    std::vector<double> line(static_cast<size_t>(a));
    std::iota(line.begin(), line.end(), 0.0);
    std::shuffle(line.begin(), line.end(), gen);
    for (double x : line) v.push_back((x - 128.0) / 16.0);
  }
  std::vector<int> perm;
  for (int d = 0; d < n; ++d) perm.push_back(d < axis ? d : d == axis ? n - 1 : d - 1);
  return transpose(Array::from_vector(v, Shape(moved), dt), perm);
}

TEST(IndexingOracle, TopKMatchesTorch) {
  struct Case {
    Shape x;
    int64_t k;
    int axis;
  };
  const Case cases[] = {{{5, 9, 4}, 3, 1}, {{7, 1000}, 10, -1}, {{6, 255}, 255, 1},
                        {{4, 6}, 0, -1},   {{13}, 1, 0},        {{3, 200, 2}, 50, 1}};
  for (const Case& c : cases) {
    for (DType dt : {DType::f32, DType::bf16}) {
      const int axis = c.x.axis(c.axis, "test");
      if (dt == DType::bf16 && c.x[axis] > 256) continue;  // distinct bf16 lines need A <= 256
      Array x = dt == DType::bf16 ? distinct_values(c.x, c.axis, 19, dt) : random_normal(c.x, 20, dt);
      std::string call = "torch.topk(y, " + std::to_string(c.k) + ", dim=" + std::to_string(axis) + ")";
      std::string label = "top_k " + c.x.str() + " k " + std::to_string(c.k) + "/" + dtype_name(dt);
      check_against_torch(
          label + " values", [&](const std::vector<Array>& in) { return top_k(in[0], c.k, c.axis).first; },
          f32_ref(call + ".values"), {x}, default_tolerance(dt));
      check_against_torch(label + " indices",
                          [&](const std::vector<Array>& in) { return top_k(in[0], c.k, c.axis).second; },
                          "y = x0.float()\nout = " + call + ".indices", {x});
    }
  }
  Array xi = cast(mul(distinct_values({4, 33}, -1, 21, DType::f32), 16.0), DType::i32);  // distinct ints
  check_against_torch("top_k i32 values", [](const std::vector<Array>& in) { return top_k(in[0], 5).first; },
                      "out = torch.topk(x0, 5).values", {xi});
}

TEST(IndexingOracle, TopKTiesAndNaN) {
  Array x = Array::from_vector(std::vector<float>{1, 3, 3, 2, 3, NAN, 0, NAN}, {8});
  auto [v, i] = top_k(x, 5);
  EXPECT_EQ(i.to_ints(), (std::vector<int64_t>{5, 7, 1, 2, 4}));
  std::vector<float> vv = v.to_floats();
  EXPECT_TRUE(std::isnan(vv[0]) && std::isnan(vv[1]));
  EXPECT_EQ(std::vector<float>(vv.begin() + 2, vv.end()), (std::vector<float>{3, 3, 3}));
  // All equal along a non-last axis: indices ascend.
  auto [v2, i2] = top_k(Array::zeros({3, 10, 2}), 4, 1);
  std::vector<int64_t> iv = i2.to_ints();
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(iv[size_t((r * 4 + j) * 2 + c)], j);
  // -0.0 and 0.0 tie.
  auto [v3, i3] = top_k(Array::from_vector(std::vector<float>{-0.0f, 0.0f, -1.0f}, {3}), 2);
  EXPECT_EQ(i3.to_ints(), (std::vector<int64_t>{0, 1}));
}

TEST(IndexingOracle, FiniteDifferences) {
  Array x = random_normal({4, 7, 3}, 30);
  Array idx = random_ints({5}, 31, 0, 7);  // repeats likely
  check_finite_differences("take", [&](const std::vector<Array>& in) { return take(in[0], idx, 1); }, {x});
  Array idx2 = random_ints({2, 3}, 32, 0, 4);
  check_finite_differences("take 2-d idx axis 0", [&](const std::vector<Array>& in) { return take(in[0], idx2, 0); },
                           {x});
  check_finite_differences("scatter_add",
                           [&](const std::vector<Array>& in) {
                             return scatter_add({4, 7, 3}, idx, in[0], 1);
                           },
                           {random_normal({4, 5, 3}, 33)});
  Array aidx = random_ints({4, 9, 3}, 34, 0, 7);
  check_finite_differences("take_along_axis",
                           [&](const std::vector<Array>& in) { return take_along_axis(in[0], aidx, 1); }, {x});
  check_finite_differences("scatter_add_along_axis",
                           [&](const std::vector<Array>& in) {
                             return scatter_add_along_axis({4, 7, 3}, aidx, in[0], 1);
                           },
                           {random_normal({4, 9, 3}, 35)});
  Array table = random_normal({11, 6}, 36);
  Array ids = random_ints({3, 4}, 37, 0, 11);
  check_finite_differences("embedding", [&](const std::vector<Array>& in) { return embedding(in[0], ids); }, {table});
  // top_k is linear away from ties; the distinct values keep eps far from any tie.
  Array tx = distinct_values({5, 9, 4}, 1, 38, DType::f32);  // gaps 1/16 >> eps
  check_finite_differences("top_k", [](const std::vector<Array>& in) { return top_k(in[0], 4, 1).first; }, {tx});
}

TEST(IndexingOracle, SecondOrderThroughVjps) {
  // d/dc of VJP(c) is the VJP's own VJP (take <-> scatter_add, gather <-> scatter).
  Array x = random_normal({4, 7, 3}, 40);
  Array idx = random_ints({5}, 41, 0, 7);
  auto vjp_of = [](auto op, const Array& primal) {
    return [op, primal](const std::vector<Array>& in) { return vjp(op, {primal}, in[0]).second[0]; };
  };
  auto take_fn = [&](const std::vector<Array>& in) { return take(in[0], idx, 1); };
  check_finite_differences("vjp of take", vjp_of(take_fn, x), {random_normal({4, 5, 3}, 42)});
  Array aidx = random_ints({4, 9, 3}, 43, 0, 7);
  auto along_fn = [&](const std::vector<Array>& in) { return take_along_axis(in[0], aidx, 1); };
  check_finite_differences("vjp of take_along_axis", vjp_of(along_fn, x), {random_normal({4, 9, 3}, 44)});
  Array table = random_normal({11, 6}, 45);
  Array ids = random_ints({3, 4}, 46, 0, 11);
  auto emb_fn = [&](const std::vector<Array>& in) { return embedding(in[0], ids); };
  check_finite_differences("vjp of embedding", vjp_of(emb_fn, table), {random_normal({3, 4, 6}, 47)});
  // Against torch: the gradient of sum(gather(x)²) is itself differentiated.
  Array x2 = random_normal({3, 6}, 48);
  Array i2 = random_ints({3, 4}, 49, 0, 6);
  check_against_torch("grad of gather-square",
                      [&](const std::vector<Array>& in) {
                        auto f = [&](const std::vector<Array>& v) { return take_along_axis(v[0], i2, 1); };
                        Array g = take_along_axis(in[0], i2, 1);
                        return vjp(f, {in[0]}, mul(g, g)).second[0];
                      },
                      "g = torch.gather(x0, 1, x1)\n(out,) = torch.autograd.grad(torch.gather(x0, 1, x1), x0, g * g, "
                      "create_graph=True)",
                      {x2, i2});
}

TEST(IndexingErrors, NameOpIndexAndShapes) {
  Array x = Array::zeros({3, 5});
  Array bad = Array::from_vector(std::vector<int64_t>{1, 7, 2}, {3});
  expect_error([&] { take(x, bad, 1); }, {"[take]", "index 7", "(3, 5)", "[0, 5)"});
  expect_error([&] { take(x, Array::from_vector(std::vector<int32_t>{-1}, {1}), 0); },
               {"[take]", "index -1", "(3, 5)"});
  expect_error([&] { take(x, Array::zeros({2}), 0); }, {"[take]", "i32 or i64", "f32(2,)"});
  expect_error([&] { take(x, bad, 2); }, {"[take]", "axis 2", "(3, 5)"});
  expect_error([&] { scatter_add({3, 5}, bad, Array::zeros({3, 2}), 1); }, {"[scatter_add]", "f32(3, 2)", "(3, 3)"});
  expect_error([&] { scatter_add({3, 5}, bad, Array::zeros({3, 3}), 1); }, {"[scatter_add]", "index 7"});
  expect_error([&] { take_along_axis(x, bad, 1); }, {"[take_along_axis]", "rank", "(3, 5)"});
  expect_error([&] { take_along_axis(x, Array::zeros({4, 2}, DType::i64), 1); }, {"[take_along_axis]", "(4, 2)"});
  expect_error([&] { take_along_axis(x, Array::full({3, 2}, 5, DType::i64), 1); }, {"[take_along_axis]", "index 5"});
  expect_error(
      [&] {
        scatter_add_along_axis({3, 5}, Array::zeros({3, 2}, DType::i64), Array::zeros({3, 3}), 1);
      },
      {"[scatter_add_along_axis]", "(3, 3)", "(3, 2)"});
  expect_error([&] { embedding(Array::zeros({4}), bad); }, {"[embedding]", "(V, D)", "f32(4,)"});
  expect_error([&] { embedding(Array::zeros({6, 2}), bad); }, {"[embedding]", "index 7", "(6, 2)"});
  expect_error([&] { one_hot(bad, 5); }, {"[one_hot]", "index 7", "num_classes 5"});
  expect_error([&] { one_hot(bad, 0); }, {"[one_hot]", "num_classes"});
  expect_error([&] { top_k(x, 6); }, {"[top_k]", "k = 6", "(3, 5)"});
  expect_error([&] { top_k(x, -1, 0); }, {"[top_k]", "k = -1"});
  expect_error([&] { top_k(Array::scalar(1.0), 1); }, {"[top_k]", "rank"});
}

}  // namespace
}  // namespace mt::testing
