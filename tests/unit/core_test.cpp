#include <cstring>
// Core types: dtype conversions, shapes and broadcasting, arrays as views, Params order,
// and the caching allocator's steady state during training steps.
#include <gtest/gtest.h>

#include <bit>
#include <immintrin.h>
#include <cmath>
#include <limits>

#include "meshtrain/meshtrain.h"
#include "meshtrain/core/block_arena.h"

#include <sys/mman.h>

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

// The inline conversions and the bulk F16C loops against the integer reference: every half, and
// every 251st f32 bit pattern (an odd stride, so ties with and without sticky bits; NaNs,
// infinities, subnormals, the overflow edge 65520 among them), one at a time and through the
// bulk loops with a tail that is not a multiple of 8; again with flush-to-zero and
// denormals-are-zero set, which the conversions must ignore.
void expect_f16_conversions_match_the_reference() {
  std::vector<uint16_t> halves(0x10000);
  for (uint32_t bits = 0; bits < 0x10000; ++bits) halves[bits] = uint16_t(bits);
  std::vector<float> widened(halves.size() - 3);
  f16_to_f32_n(halves.data() + 3, widened.data(), int64_t(widened.size()));
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint32_t reference = std::bit_cast<uint32_t>(f16_to_f32_portable(f16{uint16_t(bits)}));
    ASSERT_EQ(std::bit_cast<uint32_t>(f16_to_f32(f16{uint16_t(bits)})), reference) << bits;
    if (bits >= 3) ASSERT_EQ(std::bit_cast<uint32_t>(widened[bits - 3]), reference) << bits;
  }
  std::vector<float> floats;
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 251) floats.push_back(std::bit_cast<float>(uint32_t(bits)));
  for (float edge : {65504.0f, 65519.99f, 65520.0f, -65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f})
    floats.push_back(edge);
  std::vector<uint16_t> narrowed(floats.size() - 5);
  f32_to_f16_n(floats.data() + 5, narrowed.data(), int64_t(narrowed.size()));
  for (size_t i = 0; i < floats.size(); ++i) {
    const uint16_t reference = f32_to_f16_portable(floats[i]).bits;
    ASSERT_EQ(f32_to_f16(floats[i]).bits, reference) << std::bit_cast<uint32_t>(floats[i]);
    if (i >= 5) ASSERT_EQ(narrowed[i - 5], reference) << std::bit_cast<uint32_t>(floats[i]);
  }
  // Inside the CPU kernels' loops, where the compiler vectorizes the conversions (backend/cpu
  // is built with -fno-trapping-math): every half times 1 (widened, multiplied, narrowed) and
  // the f32 grid cast to f16.
  Array all = Array::empty(Shape{int64_t(halves.size())}, DType::f16);
  std::memcpy(all.raw(), halves.data(), halves.size() * 2);
  const Array once = mul(all, Array::scalar(1.0, DType::f16));
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t reference = f32_to_f16_portable(f16_to_f32_portable(f16{uint16_t(bits)})).bits;
    ASSERT_EQ(once.data<uint16_t>()[bits], reference) << bits;
  }
  const Array cast_grid = cast(Array::from_vector(floats, Shape{int64_t(floats.size())}), DType::f16);
  for (size_t i = 0; i < floats.size(); ++i)
    ASSERT_EQ(cast_grid.data<uint16_t>()[i], f32_to_f16_portable(floats[i]).bits) << std::bit_cast<uint32_t>(floats[i]);
}

TEST(DType, F16ConversionsMatchTheReference) {
  expect_f16_conversions_match_the_reference();
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ | DAZ
  expect_f16_conversions_match_the_reference();
  _mm_setcsr(saved);
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

// Integers read back exactly: through a double, INT64_MAX (the index checks' "no bad index")
// came back as INT64_MIN and every GPU index check failed at "flat position -9223372036854775808".
TEST(Array, ToIntsReadsEveryInt64Exactly) {
  const std::vector<int64_t> values{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
                                    (int64_t(1) << 53) + 1, -7};
  EXPECT_EQ(Array::from_vector(values, Shape{4}, DType::i64).to_ints(), values);
  EXPECT_EQ(Array::from_vector(std::vector<int64_t>{-3, 2147483647}, Shape{2}, DType::i32).to_ints(),
            (std::vector<int64_t>{-3, 2147483647}));
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

TEST(Allocator, BucketedBlocksKeptStayWithinTwiceTheirPeakInUse) {
  // A dense KV cache grown by concatenation: each step, 72 arrays (36 layers' keys and
  // values) one position longer replace the last step's. Keeping every freed size would hold
  // each bucket's 72 blocks, about 200 MiB here; the bound keeps twice the peak in use (the
  // tests before this one in the binary use a few MiB of small blocks at most).
  CachingAllocator& allocator = CachingAllocator::instance();
  std::vector<std::shared_ptr<void>> live;
  size_t every_bucket = 0;
  size_t last_bucket = 0;
  for (size_t bytes = 5120; bytes <= CachingAllocator::kLargeBlock; bytes += 5120) {
    std::vector<std::shared_ptr<void>> next;
    for (int i = 0; i < 72; ++i) next.push_back(allocator.allocate(bytes));
    live = std::move(next);
    const size_t bucket = CachingAllocator::bucket_size(bytes);
    if (bucket != last_bucket) every_bucket += 72 * bucket, last_bucket = bucket;
  }
  live.clear();
  const AllocatorStats stats = allocator.stats();
  std::cout << "  bucketed bytes kept " << (stats.bucket_bytes_cached >> 20) << " MiB (peak in use "
            << (stats.bucket_peak_bytes_in_use >> 20) << " MiB); every bucket's blocks: " << (every_bucket >> 20)
            << " MiB\n";
  EXPECT_LE(stats.bucket_bytes_cached, CachingAllocator::bucket_cache_limit(stats.bucket_peak_bytes_in_use));
  EXPECT_LT(stats.bucket_bytes_cached, every_bucket / 2);
}

TEST(Allocator, ArenaSplitsAndMergesBlocks) {
  // A private arena: the process-wide one is shared with everything else in this binary.
  BlockArena arena(size_t(1) << 30);
  ASSERT_GT(arena.reserved(), 0u);
  const size_t mb = size_t(1) << 20, page = BlockArena::kGranule;
  BlockArena::Block* a = arena.allocate(3 * mb);
  BlockArena::Block* b = arena.allocate(5 * mb + 1);  // rounds up to a page
  BlockArena::Block* c = arena.allocate(2 * mb);
  EXPECT_EQ(b->size, 5 * mb + page);
  EXPECT_EQ(arena.top(), 10 * mb + page);
  std::memset(a->address, 1, a->size);  // the pages are writable
  std::memset(c->address, 3, c->size);
  char* const start = a->address;
  arena.release(a);
  arena.release(b);  // merges with a: one free block of 8 MiB + a page
  EXPECT_EQ(arena.free_blocks(), 1u);
  EXPECT_EQ(arena.free_bytes(), 8 * mb + page);
  // A smaller request is carved from that block's start; the rest stays free.
  BlockArena::Block* d = arena.allocate(6 * mb);
  EXPECT_EQ(d->address, start);
  EXPECT_EQ(arena.free_bytes(), 2 * mb + page);
  EXPECT_EQ(arena.top(), 10 * mb + page);  // reused, not grown
  arena.release(c);  // merges with the split block's free rest
  EXPECT_EQ(arena.free_blocks(), 1u);
  EXPECT_EQ(arena.free_bytes(), 4 * mb + page);
  // Nothing free fits 7 MiB: the free block at the top grows by the difference only.
  BlockArena::Block* e = arena.allocate(7 * mb);
  EXPECT_EQ(e->address, start + 6 * mb);
  EXPECT_EQ(arena.top(), 13 * mb);
  EXPECT_EQ(arena.free_bytes(), 0u);
  // Best fit: of a 3 MiB and a 2 MiB hole, a 2 MiB request takes the 2 MiB one.
  BlockArena::Block* x = arena.allocate(3 * mb);
  arena.allocate(mb);
  BlockArena::Block* z = arena.allocate(2 * mb);
  arena.allocate(mb);
  arena.release(x);
  arena.release(z);
  EXPECT_EQ(arena.allocate(2 * mb)->address, start + 17 * mb);
  EXPECT_EQ(arena.allocate(3 * mb)->address, start + 13 * mb);
  EXPECT_EQ(arena.top(), 20 * mb);
  arena.release(d);
  arena.release(e);
  EXPECT_EQ(arena.free_blocks(), 1u);
  EXPECT_EQ(arena.free_bytes(), 13 * mb);
}

TEST(Allocator, ResidentMemoryFollowsThePeakOfLiveBytesAcrossChangingSizes) {
  // Phase after phase frees everything and allocates the same total in other sizes, as a
  // training step's layers and passes do. Exact-size caching would hold every phase's
  // blocks; splitting and merging keeps the arena at one phase's worth.
  BlockArena arena(size_t(1) << 30);
  const size_t mb = size_t(1) << 20;
  size_t peak_live = 0;
  for (size_t parts : {1, 2, 3, 5, 7, 12, 16}) {
    std::vector<BlockArena::Block*> blocks;
    size_t live = 0;
    for (size_t i = 0; i < parts; ++i) {
      blocks.push_back(arena.allocate(48 * mb / parts));
      live += blocks.back()->size;
    }
    peak_live = std::max(peak_live, live);
    for (BlockArena::Block* block : blocks) arena.release(block);
    EXPECT_EQ(arena.free_blocks(), 1u);  // everything merged back into one block
  }
  std::cout << "  arena top " << arena.top() / mb << " MiB for a peak of " << peak_live / mb << " MiB live\n";
  EXPECT_LE(arena.top(), peak_live + BlockArena::kGranule * 16);
}

// Pages of [address, address + bytes) that are in memory, as the kernel reports them.
size_t resident_pages(const char* address, size_t bytes) {
  std::vector<unsigned char> in_core(bytes / BlockArena::kGranule);
  EXPECT_EQ(mincore(const_cast<char*>(address), bytes, in_core.data()), 0);
  size_t n = 0;
  for (unsigned char page : in_core) n += page & 1;
  return n;
}

TEST(Allocator, ArenaGivesBackTheHolesTooSmallForTheRequestThatGrowsIt) {
  // A hole between live blocks that a larger request cannot use: kept resident, it would put
  // the process above its peak of live bytes (FSDP's shards left such holes under Adam's
  // moments). Growing the top gives its pages back; a request that fits takes it again.
  BlockArena arena(size_t(1) << 30);
  const size_t mb = size_t(1) << 20;
  BlockArena::Block* hole = arena.allocate(8 * mb);
  BlockArena::Block* live = arena.allocate(4 * mb);
  BlockArena::Block* small = arena.allocate(BlockArena::kDiscardMin / 2);
  BlockArena::Block* live2 = arena.allocate(4 * mb);
  for (BlockArena::Block* b : {hole, live, small, live2}) std::memset(b->address, 7, b->size);
  char* const hole_address = hole->address;
  char* const small_address = small->address;
  const size_t small_size = small->size;
  arena.release(hole);
  arena.release(small);
  EXPECT_EQ(resident_pages(hole_address, 8 * mb), 8 * mb / BlockArena::kGranule);
  // Reused without growth: nothing is given back.
  BlockArena::Block* reuse = arena.allocate(6 * mb);
  EXPECT_EQ(reuse->address, hole_address);
  EXPECT_EQ(arena.discarded_on_growth(), 0u);
  arena.release(reuse);
  BlockArena::Block* big = arena.allocate(9 * mb);  // fits no hole: the top grows
  EXPECT_EQ(big->address, live2->address + live2->size);
  EXPECT_EQ(arena.discarded_on_growth(), 8 * mb);
  EXPECT_EQ(resident_pages(hole_address, 8 * mb), 0u);
  // Holes under kDiscardMin and live blocks keep their pages and their contents.
  EXPECT_EQ(resident_pages(small_address, small_size), small_size / BlockArena::kGranule);
  EXPECT_EQ(live->address[0], 7);
  EXPECT_EQ(resident_pages(live->address, live->size), live->size / BlockArena::kGranule);
  // A second growth does not give the same hole back twice; a reused hole works again.
  arena.allocate(10 * mb);
  EXPECT_EQ(arena.discarded_on_growth(), 8 * mb);
  BlockArena::Block* again = arena.allocate(8 * mb);
  EXPECT_EQ(again->address, hole_address);
  std::memset(again->address, 9, again->size);
  EXPECT_EQ(again->address[8 * mb - 1], 9);
  arena.release(again);  // resident again: the next growth gives it back once more
  arena.allocate(11 * mb);
  EXPECT_EQ(arena.discarded_on_growth(), 16 * mb);
}

TEST(InPlace, AddWritesIntoAMovedSoleOwnerAndNowhereElse) {
  Array x = Array::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  const Array u = Array::from_vector(std::vector<float>{10, 20}, {2});
  const void* buffer = x.raw();
  x = add_in_place(std::move(x), u);  // sole owner, moved in: the same buffer
  EXPECT_EQ(x.raw(), buffer);
  EXPECT_EQ(x.to_floats(), (std::vector<float>{11, 22, 13, 24}));
  // Another handle sees the old value: the add must not overwrite it.
  Array kept = x;
  Array y = add_in_place(std::move(x), u);
  EXPECT_NE(y.raw(), kept.raw());
  EXPECT_EQ(kept.to_floats(), (std::vector<float>{11, 22, 13, 24}));
  EXPECT_EQ(y.to_floats(), (std::vector<float>{21, 42, 23, 44}));
  // A view shares the storage: no reuse either.
  Array whole = Array::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  Array row = whole.view_row(1);
  Array z = add_in_place(std::move(row), Array::from_vector(std::vector<float>{1, 1}, {2}));
  EXPECT_EQ(whole.to_floats(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(z.to_floats(), (std::vector<float>{4, 5}));
  // A broadcast that grows the result cannot reuse the smaller operand.
  Array small = Array::from_vector(std::vector<float>{1, 2}, {2});
  Array grown = add_in_place(std::move(small), Array::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2}));
  EXPECT_EQ(grown.to_floats(), (std::vector<float>{2, 4, 4, 6}));
}

TEST(InPlace, ApplyUpdatesKeepsParametersOthersStillHold) {
  Params params{{"w", Array::from_vector(std::vector<float>{1, 2}, {2})}};
  Params updates{{"w", Array::from_vector(std::vector<float>{0.5f, 0.5f}, {2})}};
  const Params before = params;  // held elsewhere (a checkpoint being written, an EMA, ...)
  Params after = optim::apply_updates(std::move(params), updates);
  EXPECT_EQ(before.at("w").to_floats(), (std::vector<float>{1, 2}));
  EXPECT_EQ(after.at("w").to_floats(), (std::vector<float>{1.5f, 2.5f}));
  const void* buffer = after.at("w").raw();
  after = optim::apply_updates(std::move(after), updates);  // now the only holder: in place
  EXPECT_EQ(after.at("w").raw(), buffer);
  EXPECT_EQ(after.at("w").to_floats(), (std::vector<float>{2, 3}));
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
