// Philox known answers, distribution sanity, slice-equals-whole (the basis of sharded
// init and dropout), dropout masks and their VJP, fold_in streams.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <set>
#include <vector>

#include "meshtrain/backend/random.h"
#include "meshtrain/meshtrain.h"

namespace mt {
namespace {

TEST(Philox, Random123KnownAnswers) {
  struct Case {
    std::array<uint32_t, 4> counter;
    std::array<uint32_t, 2> key;
    std::array<uint32_t, 4> expected;
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Case& c : cases) EXPECT_EQ(philox4x32(c.counter, c.key), c.expected);
}

// Mean and variance of 1e6 samples against the distribution's, within ~6 standard errors.
void expect_moments(const std::vector<float>& v, double mean, double var, const char* label) {
  double s = 0, s2 = 0;
  for (float x : v) s += x;
  const double m = s / double(v.size());
  for (float x : v) s2 += (x - m) * (x - m);
  const double sample_var = s2 / double(v.size() - 1);
  const double n = double(v.size());
  std::cout << "  [moments] " << label << ": mean " << m << " (want " << mean << "), var " << sample_var << " (want "
            << var << ")\n";
  EXPECT_NEAR(m, mean, 6 * std::sqrt(var / n)) << label;
  EXPECT_NEAR(sample_var, var, 6 * var * std::sqrt(2.0 / n)) << label;
}

TEST(Random, UniformAndNormalMoments) {
  const RngKey key{1234, 7};
  const Shape shape{1000, 1000};
  Array u = random_uniform(key, shape);
  std::vector<float> uv = u.to_floats();
  for (float x : uv) ASSERT_TRUE(x >= 0.0f && x < 1.0f);
  expect_moments(uv, 0.5, 1.0 / 12.0, "uniform [0, 1)");
  expect_moments(random_uniform(key, shape, DType::f32, -2.0, 3.0).to_floats(), 0.5, 25.0 / 12.0, "uniform [-2, 3)");
  expect_moments(random_normal(key, shape).to_floats(), 0.0, 1.0, "normal(0, 1)");
  expect_moments(random_normal(key.fold_in(3), shape, DType::f32, 1.5, 0.5).to_floats(), 1.5, 0.25, "normal(1.5, 0.5)");
  // bf16 outputs are the rounded f32 values.
  Array nb = random_normal(key, {1001}, DType::bf16);
  Array nf = random_normal(key, {1001}, DType::f32);
  EXPECT_EQ(nb.to_floats(), cast(nf, DType::bf16).to_floats());
  // Normal tails: no infinities or NaNs, extremes plausible for 1e6 samples.
  double lo = 0, hi = 0;
  for (float x : random_normal(key, shape).to_floats()) {
    ASSERT_TRUE(std::isfinite(x));
    lo = std::min(lo, double(x));
    hi = std::max(hi, double(x));
  }
  EXPECT_LT(lo, -4.0);
  EXPECT_GT(hi, 4.0);
}

TEST(Random, SliceOfWholeEqualsGeneratedAlone) {
  const RngKey key{99, 5};
  const int64_t total = 300007;  // odd: slices start and end inside Philox blocks
  std::vector<float> whole_u(static_cast<size_t>(total)), whole_n(static_cast<size_t>(total));
  fill_uniform(key, 0, total, whole_u.data());
  fill_normal(key, 0, total, whole_n.data());
  const std::pair<int64_t, int64_t> slices[] = {{0, 1}, {1, 3}, {3, 5}, {7, 100003}, {131071, 70001}, {total - 2, 2}};
  for (auto [offset, n] : slices) {
    std::vector<float> u(static_cast<size_t>(n)), z(static_cast<size_t>(n));
    fill_uniform(key, uint64_t(offset), n, u.data());
    fill_normal(key, uint64_t(offset), n, z.data());
    EXPECT_EQ(0, std::memcmp(u.data(), whole_u.data() + offset, size_t(n) * 4)) << "uniform slice " << offset;
    EXPECT_EQ(0, std::memcmp(z.data(), whole_n.data() + offset, size_t(n) * 4)) << "normal slice " << offset;
  }
  // Single-element generators agree bitwise with the bulk fills.
  for (int64_t i : {int64_t(0), int64_t(1), int64_t(2), int64_t(3), int64_t(4), int64_t(99999), total - 1}) {
    EXPECT_EQ(uniform_at(key, uint64_t(i)), whole_u[size_t(i)]);
    EXPECT_EQ(normal_at(key, uint64_t(i)), whole_n[size_t(i)]);
  }
  // Array-level: row r of a (R, C) array equals elements [r*C, (r+1)*C) of the stream.
  Array a = random_uniform(key, {996, 301});
  std::vector<float> av = a.to_floats();
  EXPECT_EQ(0, std::memcmp(av.data(), whole_u.data(), av.size() * 4));
  Array z = random_normal(key, {301, 996});
  std::vector<float> zv = z.to_floats();
  EXPECT_EQ(0, std::memcmp(zv.data(), whole_n.data(), zv.size() * 4));
}

TEST(Random, BernoulliAndDropoutMask) {
  const RngKey key{7, 11};
  const Shape shape{513, 1027};
  const double n = double(shape.numel());
  for (double p : {0.0, 0.1, 0.5, 0.9, 1.0}) {
    Array b = bernoulli(key, shape, p);
    ASSERT_EQ(b.dtype(), DType::boolean);
    double frac = sum(cast(b, DType::f32)).item() / n;
    std::cout << "  [bernoulli] p " << p << ": fraction " << frac << "\n";
    EXPECT_NEAR(frac, p, 6 * std::sqrt(p * (1 - p) / n) + 1e-12);
  }
  Array x = add(random_normal(RngKey{1, 1}, shape), 3.0);  // no zeros in x
  for (double rate : {0.1, 0.25, 0.5}) {
    Array y = dropout(x, rate, key, true);
    std::vector<float> xv = x.to_floats(), yv = y.to_floats();
    int64_t dropped = 0;
    const float scale = float(1.0 / (1.0 - rate));
    for (size_t i = 0; i < xv.size(); ++i) {
      bool keep = double(uniform_at(key, i)) >= rate;  // the documented mask
      ASSERT_EQ(yv[i], keep ? xv[i] * scale : 0.0f) << "element " << i;
      dropped += !keep;
    }
    double frac = double(dropped) / n;
    std::cout << "  [dropout] rate " << rate << ": dropped fraction " << frac << "\n";
    EXPECT_NEAR(frac, rate, 6 * std::sqrt(rate * (1 - rate) / n));
    // Deterministic given the key; another key gives another mask.
    EXPECT_EQ(dropout(x, rate, key, true).to_floats(), yv);
    EXPECT_NE(dropout(x, rate, key.fold_in(1), true).to_floats(), yv);
    // The mask of a row slice equals the slice of the whole mask (global element index).
    Array x_rows = slice(x, 0, 0, 5);
    std::vector<float> yr = dropout(x_rows, rate, key, true).to_floats();
    EXPECT_EQ(0, std::memcmp(yr.data(), yv.data(), yr.size() * 4));
  }
  // Eval mode and rate 0 return x itself; rate 1 drops everything.
  EXPECT_TRUE(dropout(x, 0.5, key, false).shares_storage(x));
  EXPECT_TRUE(dropout(x, 0.0, key, true).shares_storage(x));
  EXPECT_EQ(sum(abs(dropout(x, 1.0, key, true))).item(), 0.0);
  // bf16 dropout keeps exactly the f32 mask.
  Array xb = cast(x, DType::bf16);
  std::vector<float> yb = dropout(xb, 0.3, key, true).to_floats(), xbv = xb.to_floats();
  for (size_t i = 0; i < xbv.size(); i += 97)
    EXPECT_EQ(yb[i] == 0.0f, double(uniform_at(key, i)) < 0.3) << "bf16 element " << i;
}

// The CPU kernels test kept elements in f32 against keep_threshold(rate), the GPU kernels the
// uniform's 24 bits k against keep_steps(rate); both must agree with the double comparison
// uniform >= rate on every uniform value k / 2^24.
TEST(Random, KeepThresholdEqualsTheDoubleComparison) {
  const double nan = std::nan("");
  for (double rate : {-0.5, 0.0, 1e-9, 0.1, 1.0 / 3.0, 0.5, 0.9, 1.0 - 1e-9, 1.0, 2.0, nan}) {
    const float t = mt::kernels::keep_threshold(rate);
    const uint32_t steps = mt::kernels::keep_steps(rate);
    int64_t wrong_f32 = 0, wrong_steps = 0;
    for (uint32_t k = 0; k < (1u << 24); ++k) {
      const float u = float(k) * (1.0f / 16777216.0f);
      const bool keep = double(u) >= rate;
      wrong_f32 += (u >= t) != keep;
      wrong_steps += (k >= steps) != keep;
    }
    EXPECT_EQ(wrong_f32, 0) << "rate " << rate;
    EXPECT_EQ(wrong_steps, 0) << "rate " << rate << " steps " << steps;
  }
}

TEST(Random, DropoutVjpUsesTheSameMask) {
  const RngKey key{3, 4};
  Array x = random_normal(RngKey{5, 6}, {37, 53});
  Array cot = random_normal(RngKey{8, 9}, {37, 53});
  auto fn = [&](const std::vector<Array>& in) { return dropout(in[0], 0.4, key, true); };
  auto [out, grads] = vjp(fn, {x}, cot);
  std::vector<float> g = grads[0].to_floats(), c = cot.to_floats(), o = out.to_floats(), xv = x.to_floats();
  const float scale = float(1.0 / 0.6);
  for (size_t i = 0; i < g.size(); ++i) {
    const bool keep = double(uniform_at(key, i)) >= 0.4;
    ASSERT_EQ(g[i], keep ? c[i] * scale : 0.0f);
    ASSERT_EQ(o[i], keep ? xv[i] * scale : 0.0f);
  }
  // Second order: the VJP of the VJP is the same masked scaling (dropout is linear).
  auto grad_fn = [&](const std::vector<Array>& in) {
    return vjp([&](const std::vector<Array>& v) { return dropout(v[0], 0.4, key, true); }, {x}, in[0]).second[0];
  };
  auto [g1, gg] = vjp(grad_fn, {cot}, cot);
  EXPECT_EQ(gg[0].to_floats(), g);
}

TEST(Random, ALastFoldReadFromMemoryDrawsAsTheHostFoldAndFollowsItsValue) {
  // The Trainer's step key: one key object for every step, the step number read from an i64
  // scalar when the kernels run (so a captured GPU step replays the same launches).
  const RngKey root = RngKey{11, 12}.fold_in(3);
  const Array step = Array::scalar(7, DType::i64, Device::cpu());
  const RngKey key = root.folding_last(step);
  EXPECT_EQ(key.fold_in(2).resolved().stream, root.fold_in(2).fold_in(7).stream);  // folded last
  EXPECT_EQ(key.host_resolved().stream, root.fold_in(7).stream);
  const Array x = random_normal(RngKey{5, 6}, {9, 13});
  const Array gamma = random_normal(RngKey{5, 7}, {13}), beta = random_normal(RngKey{5, 8}, {13});
  const Array q = random_normal(RngKey{6, 1}, {2, 2, 5, 8}), k = random_normal(RngKey{6, 2}, {2, 2, 6, 8}),
              v = random_normal(RngKey{6, 3}, {2, 2, 6, 8});
  auto draws = [&](const RngKey& kk) {
    std::vector<std::vector<float>> out;
    out.push_back(dropout(x, 0.3, kk, true).to_floats());
    out.push_back(add_dropout(x, x, 0.3, kk, true).to_floats());
    out.push_back(add_dropout_layer_norm(x, x, gamma, beta, 1e-5, 0.3, kk, true).to_floats());
    out.push_back(flash_attention(q, k, v, 0.35, true, 0.3, kk).to_floats());
    // The backward pass draws the mask again, from the same key.
    out.push_back(vjp([&](const std::vector<Array>& in) { return dropout(in[0], 0.3, kk, true); }, {x}, x).second[0].to_floats());
    return out;
  };
  EXPECT_EQ(draws(key), draws(root.fold_in(7)));
  // The next step writes its number where the key reads it: new masks, the same key object.
  const int64_t next = 8;
  step.write_from_host(&next);
  const auto step8 = draws(key);
  EXPECT_EQ(step8, draws(root.fold_in(8)));
  EXPECT_NE(step8[0], draws(root.fold_in(7))[0]);
  // Host draws must name the value: an unresolved key is refused, not silently unfolded.
  std::vector<float> head(4);
  EXPECT_THROW(fill_uniform(key, 0, 4, head.data()), Error);
  EXPECT_THROW(root.folding_last(Array::scalar(1, DType::f32, Device::cpu())), Error);
  EXPECT_THROW(root.folding_last(Array::zeros({2}, DType::i64, Device::cpu())), Error);
}

TEST(Random, FoldInGivesDistinctStreams) {
  const RngKey base{42, 0};
  std::set<uint64_t> streams;
  std::set<std::vector<float>> heads;
  for (uint64_t d = 0; d < 1000; ++d) {
    RngKey k = base.fold_in(d);
    EXPECT_EQ(k.seed, base.seed);
    streams.insert(k.stream);
    std::vector<float> head(8);
    fill_uniform(k, 0, 8, head.data());
    heads.insert(head);
    EXPECT_EQ(k.stream, base.fold_in(d).stream);  // deterministic
  }
  EXPECT_EQ(streams.size(), 1000u);
  EXPECT_EQ(heads.size(), 1000u);
  // Derived streams differ from the small literal streams and from each other's children.
  for (uint64_t s = 0; s < 16; ++s) EXPECT_EQ(streams.count(s), 0u);
  EXPECT_NE(base.fold_in(1).fold_in(2).stream, base.fold_in(2).fold_in(1).stream);
  // The same fold-in data under different seeds gives different values.
  EXPECT_NE(random_uniform(RngKey{1, 0}.fold_in(5), {4}).to_floats(),
            random_uniform(RngKey{2, 0}.fold_in(5), {4}).to_floats());
}

TEST(Random, Errors) {
  const RngKey key{1, 2};
  auto expect_error = [](auto&& f, const std::string& needle) {
    try {
      f();
      FAIL() << "expected mt::Error containing " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { random_uniform(key, {3}, DType::i32); }, "[random_uniform]");
  expect_error([&] { random_uniform(key, {3}, DType::f32, 2.0, 1.0); }, "[random_uniform]");
  expect_error([&] { random_normal(key, {3}, DType::boolean); }, "[random_normal]");
  expect_error([&] { random_normal(key, {3}, DType::f32, 0.0, -1.0); }, "[random_normal]");
  expect_error([&] { bernoulli(key, {3}, 1.5); }, "[bernoulli]");
  expect_error([&] { dropout(Array::zeros({2, 3}), 1.5, key, true); }, "(2, 3)");
  expect_error([&] { dropout(Array::zeros({2}, DType::i64), 0.5, key, true); }, "[dropout]");
}

}  // namespace
}  // namespace mt
