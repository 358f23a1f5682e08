// Core types: dtype conversions, shapes and broadcasting, arrays as views, Params order,
// and the caching allocator's steady state during training steps.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "meshtrain/meshtrain.h"

namespace mt {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 lies exactly halfway between two bf16 values: ties go to the even one.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(DType, F16RoundTripsEveryHalfValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    f16 h{uint16_t(bits)};
    float f = f16_to_f32(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f).bits, h.bits) << bits;
  }
  EXPECT_EQ(f32_to_f16(65520.0f).bits, 0x7c00);       // rounds up to inf
  EXPECT_EQ(f32_to_f16(5.9604645e-08f).bits, 0x0001);  // smallest subnormal
}

TEST(Shape, BroadcastAndErrors) {
  EXPECT_EQ(broadcast_shapes({3, 1, 5}, {4, 1}, "t"), (Shape{3, 4, 5}));
  EXPECT_EQ(broadcast_shapes({}, {2}, "t"), (Shape{2}));
  try {
    broadcast_shapes({2, 3}, {4, 3}, "add");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[add] shapes (2, 3) and (4, 3) do not broadcast");
  }
  EXPECT_THROW(Shape({2, 3}).axis(2, "sum"), Error);
  EXPECT_EQ(Shape({2, 3}).axis(-1, "sum"), 1);
}

TEST(Array, ReshapeIsAViewAndCastConverts) {
  Array a = Array::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Array r = reshape(a, {3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_TRUE(r.shares_storage(a));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.raw()) % 64, 0u);
  EXPECT_THROW(reshape(a, {4, -1}), Error);
  Array i = cast(Array::from_vector(std::vector<float>{-1.7f, 2.9f}, {2}), DType::i64);
  EXPECT_EQ(i.to_ints(), (std::vector<int64_t>{-1, 2}));
}

TEST(Params, KeepsInsertionOrderAndNamesMissingPaths) {
  Params p;
  p.set("b", Array::zeros({1}));
  p.set("a", Array::zeros({2}));
  p.set("b", Array::zeros({3}));
  EXPECT_EQ(p.paths(), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(p.at("b").numel(), 3);
  try {
    p.at("encoder.missing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("encoder.missing"), std::string::npos);
  }
  p.set("enc.w", Array::zeros({4}));
  EXPECT_EQ(p.subtree("enc").paths(), (std::vector<std::string>{"w"}));
}

TEST(Allocator, TrainingStepAllocatesNothingAfterWarmUp) {
  RngKey key{7, 0};
  Params params{{"w1", mul(random_normal(key.fold_in(1), {32, 64}), 0.1)},
                {"b1", Array::zeros({64})},
                {"w2", mul(random_normal(key.fold_in(2), {64, 8}), 0.1)}};
  Array x = random_normal(key.fold_in(3), {16, 32});
  Array y = random_normal(key.fold_in(4), {16, 8});
  auto loss_fn = [&](const Params& p) {
    Array h = gelu(add(matmul(x, p.at("w1")), p.at("b1")));
    return mean(square(sub(matmul(h, p.at("w2")), y)));
  };
  auto step = [&] {
    auto [loss, grads] = value_and_grad(loss_fn)(params);
    for (auto& [path, value] : params) value = sub(value, mul(grads.at(path), 0.1));
    return loss.item();
  };
  double first = step();
  for (int i = 0; i < 3; ++i) step();
  uint64_t before = CachingAllocator::instance().stats().os_allocations;
  double last = 0;
  for (int i = 0; i < 10; ++i) last = step();
  uint64_t after = CachingAllocator::instance().stats().os_allocations;
  std::cout << "  os allocations over 10 steady steps: " << after - before << ", cache hits "
            << CachingAllocator::instance().stats().cache_hits << "\n";
  EXPECT_EQ(after, before);
  EXPECT_LT(last, first);
}

TEST(Allocator, BucketsBoundWaste) {
  for (size_t bytes : {1ul, 63ul, 4097ul, 100000ul, 123456789ul}) {
    size_t b = CachingAllocator::bucket_size(bytes);
    EXPECT_GE(b, bytes);
    EXPECT_LE(double(b), double(bytes) * 1.125 + 64);
  }
}

}  // namespace
}  // namespace mt
