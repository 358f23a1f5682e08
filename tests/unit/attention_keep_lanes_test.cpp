// The lane arithmetic of the GPU attention kernels' dropout verdicts (attention_keep_lanes.h),
// run here on the host for a whole warp: each lane draws its blocks, passes its partner's
// verdicts as the kernels' one shuffle does, and must end with the verdicts of exactly its own
// fragment elements. A GPU test checks the kernels' results; this pins the index mapping on
// every machine, with or without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <random>

#include "meshtrain/backend/cuda/attention_keep_lanes.h"

namespace kl = mt::cuda::keep_lanes;

namespace {

constexpr int kLanes = 32, kRows = 16, kCols = 64;

// mma.sync's m16n8 C fragment: lane 4g + t holds c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t),
// c3 (g + 8, 2t + 1) of each 8-column tile n, independently of the header.
int layout_row(int lane, int e) { return (e < 2 ? 0 : 8) + lane / 4; }
int layout_column(int lane, int n, int e) { return 8 * n + 2 * (lane % 4) + e % 2; }

// A warp block's verdicts, two in three kept, and lane's verdict of its fragment element (n, e).
using Verdicts = std::array<std::array<bool, kCols>, kRows>;
Verdicts random_verdicts(std::mt19937& rng) {
  Verdicts v{};
  for (auto& row : v)
    for (bool& keep : row) keep = rng() % 3 != 0;
  return v;
}
bool fragment_verdict(const Verdicts& v, int lane, int n, int e) {
  return v[size_t(layout_row(lane, e))][size_t(layout_column(lane, n, e))];
}

// How many of lane's 32 verdicts in `got` differ from the block's; `direct` gets the block's
// set one by one (set_kept), so that the caller compares the two layouts whole.
template <class Keeps>
int wrong_verdicts(const Keeps& got, const Verdicts& v, int lane, Keeps& direct) {
  int wrong = 0;
  for (int n = 0; n < 8; ++n)
    for (int e = 0; e < 4; ++e) {
      const bool want = fragment_verdict(v, lane, n, e);
      wrong += kl::kept(got, n, e) != want;
      kl::set_kept(direct, n, e, want);
      EXPECT_EQ(kl::kept(direct, n, e), want);
    }
  return wrong;
}

}  // namespace

TEST(AttentionKeepLanes, ElementPositionsAreTheMmaLayout) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int n = 0; n < 8; ++n)
      for (int e = 0; e < 4; ++e) {
        EXPECT_EQ(kl::element_row(lane, e), layout_row(lane, e)) << "lane " << lane << " e " << e;
        EXPECT_EQ(kl::element_column(lane, n, e), layout_column(lane, n, e)) << "lane " << lane << " n " << n;
      }
}

TEST(AttentionKeepLanes, EachLaneEndsWithItsOwnVerdictsAndEveryBlockIsDrawnOnce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const Verdicts verdict = random_verdicts(rng);
    std::array<std::array<int, kCols / 4>, kRows> draws{};
    std::array<uint32_t, kLanes> own{}, passed{};
    for (int lane = 0; lane < kLanes; ++lane) {
      for (int i = 0; i < 8; ++i) {
        const int r = kl::drawn_row(lane), c = kl::drawn_column(lane, i);
        ASSERT_EQ(c % 4, 0);
        ++draws[size_t(r)][size_t(c / 4)];
        uint32_t four = 0;
        for (int j = 0; j < 4; ++j) four |= uint32_t(verdict[size_t(r)][size_t(c + j)]) << j;
        kl::split_block(four, lane, i, own[size_t(lane)], passed[size_t(lane)]);
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int m = 0; m < kCols / 4; ++m) ASSERT_EQ(draws[size_t(r)][size_t(m)], 1) << "row " << r << " block " << m;
    int wrong = 0;
    for (int lane = 0; lane < kLanes; ++lane) {
      // __shfl_xor_sync(passed, 1): each lane receives its partner's passed bits.
      const kl::FragmentKeeps k = kl::assemble(lane, own[size_t(lane)], passed[size_t(lane ^ 1)]);
      kl::FragmentKeeps direct;
      wrong += wrong_verdicts(k, verdict, lane, direct);
      EXPECT_EQ(direct.row[0], k.row[0]) << "lane " << lane;
      EXPECT_EQ(direct.row[1], k.row[1]) << "lane " << lane;
    }
    ASSERT_EQ(wrong, 0) << "trial " << trial;
  }
}

// The forward's bits for the backward: the four lanes of a row together give each half's word
// (bit c % 32 for column c), and each lane reads its own verdicts back from the words.
TEST(AttentionKeepLanes, RowWordsGatherAndScatterTheFragments) {
  std::mt19937 rng(11);
  const Verdicts verdict = random_verdicts(rng);
  std::array<kl::FragmentKeeps, kLanes> mine{};
  for (int lane = 0; lane < kLanes; ++lane)
    for (int n = 0; n < 8; ++n)
      for (int e = 0; e < 4; ++e)
        kl::set_kept(mine[size_t(lane)], n, e, fragment_verdict(verdict, lane, n, e));
  for (int r = 0; r < kRows; ++r)
    for (int half = 0; half < 2; ++half) {
      uint32_t want = 0, got = 0;
      for (int c = 0; c < 32; ++c) want |= uint32_t(verdict[size_t(r)][size_t(32 * half + c)]) << c;
      for (int t = 0; t < 4; ++t) got |= kl::row_half_part(mine[size_t(4 * (r % 8) + t)], 4 * (r % 8) + t, r / 8, half);
      EXPECT_EQ(got, want) << "row " << r << " half " << half;
      for (int t = 0; t < 4; ++t) {
        const int lane = 4 * (r % 8) + t;
        kl::FragmentKeeps back;
        kl::set_row_half(back, lane, r / 8, half, want);
        for (int n = 4 * half; n < 4 * half + 4; ++n)
          for (int b = 0; b < 2; ++b)
            EXPECT_EQ(kl::kept(back, n, 2 * (r / 8) + b), verdict[size_t(r)][size_t(8 * n + 2 * t + b)])
                << "row " << r << " lane " << lane << " n " << n;
      }
    }
}

// The dK/dV kernel's transposed blocks (4 rows of one column each): every lane of a group of
// four draws 8 of the group's 32 blocks, reads the four words by shuffles, and must end with
// exactly its own verdicts; every block of the warp drawn once.
TEST(AttentionKeepLanes, ColumnBlocksReachTheirFourLanes) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 50; ++trial) {
    const Verdicts verdict = random_verdicts(rng);
    std::array<std::array<int, kCols>, kRows / 4> draws{};
    std::array<uint32_t, kLanes> word{};
    for (int lane = 0; lane < kLanes; ++lane)
      for (int i = 0; i < 8; ++i) {
        const int r = kl::column_drawn_row(lane, i), c = kl::column_drawn_column(lane, i);
        ASSERT_EQ(r % 4, 0);
        ++draws[size_t(r / 4)][size_t(c)];
        for (int j = 0; j < 4; ++j) word[size_t(lane)] |= uint32_t(verdict[size_t(r + j)][size_t(c)]) << (4 * i + j);
      }
    for (int a = 0; a < kRows / 4; ++a)
      for (int c = 0; c < kCols; ++c) ASSERT_EQ(draws[size_t(a)][size_t(c)], 1) << "rows " << 4 * a << " column " << c;
    int wrong = 0;
    for (int lane = 0; lane < kLanes; ++lane) {
      kl::ColumnKeeps k, direct;
      for (int s = 0; s < 4; ++s)  // __shfl_sync(word, column_source_lane(lane, s))
        k.bits |= kl::column_bits_from(lane, s, word[size_t(kl::column_source_lane(lane, s))]);
      wrong += wrong_verdicts(k, verdict, lane, direct);
      EXPECT_EQ(k.bits, direct.bits) << "lane " << lane;
    }
    ASSERT_EQ(wrong, 0) << "trial " << trial;
  }
}

// The bits the forward stores for the backward (MT_ATTENTION_DROPOUT_BITS=1), through the
// kernels' own rules: each forward warp's four lanes of a row OR their parts and lane t writes
// its word (stored_row, stored_half), every (query, half) written once and holding that query's
// verdicts; the dK/dV kernel's lanes read them back by columns (column_word_half and _shift,
// keys g and g + 8 bits apart) and end with their fragment's verdicts, keys as rows.
TEST(AttentionKeepLanes, StoredWordsReadBackByColumns) {
  std::mt19937 rng(23);
  constexpr int kQueries = 64;  // four forward warps of 16 rows over one 64-key tile
  std::array<std::array<bool, kCols>, kQueries> verdict{};
  for (auto& row : verdict)
    for (bool& keep : row) keep = rng() % 3 != 0;
  std::array<std::array<uint32_t, 2>, kQueries> words{};
  std::array<std::array<int, 2>, kQueries> writes{};
  for (int wq0 = 0; wq0 < kQueries; wq0 += kRows) {
    std::array<kl::FragmentKeeps, kLanes> mine{};
    for (int lane = 0; lane < kLanes; ++lane)
      for (int n = 0; n < 8; ++n)
        for (int e = 0; e < 4; ++e)
          kl::set_kept(mine[size_t(lane)], n, e,
                       verdict[size_t(wq0 + kl::element_row(lane, e))][size_t(kl::element_column(lane, n, e))]);
    for (int lane = 0; lane < kLanes; ++lane) {
      // The two xor-shuffles (1, 2): the OR over lanes 4g .. 4g + 3 of the part for (h, half).
      const int h = (lane % 4) / 2, half = kl::stored_half(lane);
      uint32_t word = 0;
      for (int t = 0; t < 4; ++t) word |= kl::row_half_part(mine[size_t(lane / 4 * 4 + t)], lane / 4 * 4 + t, h, half);
      const int q = wq0 + kl::stored_row(lane);
      words[size_t(q)][size_t(half)] = word;
      ++writes[size_t(q)][size_t(half)];
    }
  }
  for (int q = 0; q < kQueries; ++q)
    for (int half = 0; half < 2; ++half) {
      ASSERT_EQ(writes[size_t(q)][size_t(half)], 1) << "query " << q << " half " << half;
      for (int c = 0; c < 32; ++c)
        ASSERT_EQ((words[size_t(q)][size_t(half)] >> c) & 1u, uint32_t(verdict[size_t(q)][size_t(32 * half + c)]))
            << "query " << q << " key " << 32 * half + c;
    }
  int wrong = 0;
  for (int64_t wk0 = 0; wk0 < kCols; wk0 += 16)
    for (int lane = 0; lane < kLanes; ++lane) {
      kl::ColumnKeeps k;  // as load_keeps_by_columns builds it (queries from i0 = 0)
      const int half = kl::column_word_half(wk0), shift = kl::column_word_shift(wk0, lane);
      for (int n = 0; n < 8; ++n)
        for (int b = 0; b < 2; ++b) {
          const uint32_t bits = words[size_t(kl::element_column(lane, n, b))][size_t(half)] >> shift;
          kl::set_kept(k, n, b, bits & 1u);
          kl::set_kept(k, n, 2 + b, (bits >> 8) & 1u);
        }
      for (int n = 0; n < 8; ++n)
        for (int e = 0; e < 4; ++e)
          wrong += kl::kept(k, n, e) !=
                   verdict[size_t(kl::element_column(lane, n, e))][size_t(wk0 + kl::element_row(lane, e))];
    }
  EXPECT_EQ(wrong, 0) << "verdicts read back wrong by columns";
}
