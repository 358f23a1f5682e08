#pragma once
// Which dropout verdicts each lane of the tensor-core attention kernels (attention_tensor_core.cu)
// draws, and how lanes trade them (a pair in the forward and dQ, a group of four in dK/dV), so
// that every lane ends with the verdicts of its own score fragment in registers. Plain C++ (host
// and device), so that the CPU tests check the lane arithmetic, which no CPU kernel shares,
// exhaustively.
//
// A warp's block of scores is 16 rows by 64 columns; rows are queries (forward, dQ), columns
// keys, and element (r, c) of the (BH, Tq, Tk) probabilities sits at idx0 + r·stride + c. In
// mma.sync's C layout lane 4g + t holds rows g and g + 8 (h = 0, 1) at columns 8n + 2t + b
// (n < 8, b < 2): fragment element (n, e) is row g + 8(e / 2), column 8n + 2t + (e & 1). One
// Philox block holds the verdicts of columns 4m .. 4m + 3 of a row, and the columns of block m
// belong to lanes t = 2(m % 2) and t + 1. So lanes t and t ^ 1 need the same 16 blocks (rows g
// and g + 8, the 8 blocks m ≡ t / 2 mod 2 of each): the lane of parity q = t % 2 draws row g +
// 8q's, keeps the two verdicts of each block that are its own and passes the other two to its
// partner in one shuffle. The warp draws each of its 256 blocks once, 8 per lane, as the
// shared-memory flags did, but no byte goes through shared memory and no flag is reloaded.
#include <cstdint>

#if defined(__CUDACC__)
#define MT_KEEP_LANES_FN __host__ __device__ inline
#else
#define MT_KEEP_LANES_FN inline
#endif

namespace mt::cuda::keep_lanes {

// A lane's verdicts: bit 2n + b of row[h] keeps its fragment element (n, e = 2h + b).
struct FragmentKeeps {
  uint32_t row[2] = {0u, 0u};
};

// (Rows chosen by selects, not indexes: a run-time index would put the pair in local memory.)
MT_KEEP_LANES_FN bool kept(const FragmentKeeps& k, int n, int e) {
  return ((e < 2 ? k.row[0] : k.row[1]) >> (2 * n + (e & 1))) & 1u;
}

// The row (0 .. 15) whose blocks lane draws, and the first column of its i-th block (i < 8).
MT_KEEP_LANES_FN int drawn_row(int lane) { return lane / 4 + 8 * (lane % 2); }
MT_KEEP_LANES_FN int drawn_column(int lane, int i) { return 4 * (2 * i + (lane % 4) / 2); }

// Block i's four verdicts (bit j: column drawn_column + j) split into the lane's own two (into
// bits 2i, 2i + 1 of `own`) and its partner's (of `passed`).
MT_KEEP_LANES_FN void split_block(uint32_t four, int lane, int i, uint32_t& own, uint32_t& passed) {
  const int q = lane % 2;
  own |= ((four >> (2 * q)) & 3u) << (2 * i);
  passed |= ((four >> (2 - 2 * q)) & 3u) << (2 * i);
}

// The lane's verdicts from its own bits and those its partner (lane ^ 1) passed it.
MT_KEEP_LANES_FN FragmentKeeps assemble(int lane, uint32_t own, uint32_t received) {
  FragmentKeeps k;
  const bool odd = lane % 2 != 0;
  k.row[0] = odd ? received : own;
  k.row[1] = odd ? own : received;
  return k;
}

// Where a lane draws each of its fragment elements itself (rows that do not start a Philox
// block): the row and column of element (n, e).
MT_KEEP_LANES_FN int element_row(int lane, int e) { return lane / 4 + 8 * (e / 2); }
MT_KEEP_LANES_FN int element_column(int lane, int n, int e) { return 8 * n + 2 * (lane % 4) + (e & 1); }
MT_KEEP_LANES_FN void set_kept(FragmentKeeps& k, int n, int e, bool keep) {
  const uint32_t bit = keep ? 1u << (2 * n + (e & 1)) : 0u;
  if (e < 2)
    k.row[0] |= bit;
  else
    k.row[1] |= bit;
}

// The bits the forward keeps for the backward (FlashAttentionShape::keep_bits) are row words:
// bit c % 32 of half c / 32 for column c. A lane holds 8 bits of each half of its two rows:
// its part of row h's half in that layout (the four lanes of a row OR theirs together), and
// its fragment bits taken back from the whole word.
MT_KEEP_LANES_FN uint32_t row_half_part(const FragmentKeeps& k, int lane, int h, int half) {
  uint32_t word = 0;
  for (int nn = 0; nn < 4; ++nn) word |= ((k.row[h] >> (2 * (4 * half + nn))) & 3u) << (8 * nn + 2 * (lane % 4));
  return word;
}
MT_KEEP_LANES_FN void set_row_half(FragmentKeeps& k, int lane, int h, int half, uint32_t word) {
  for (int nn = 0; nn < 4; ++nn) k.row[h] |= ((word >> (8 * nn + 2 * (lane % 4))) & 3u) << (2 * (4 * half + nn));
}

// The row words a lane writes: the four lanes of a row (4g .. 4g + 3) OR their parts together,
// then lane t writes half t % 2 of row g + 8((t % 4) / 2) (each of the four one word).
MT_KEEP_LANES_FN int stored_row(int lane) { return lane / 4 + 8 * ((lane % 4) / 2); }
MT_KEEP_LANES_FN int stored_half(int lane) { return lane % 2; }
// The dK/dV kernel reads them back by columns: for its 16 keys from wk0 (a multiple of 16) the
// word of query c's half (wk0 % 64) / 32 holds key g's verdict at bit (wk0 % 32) + g and key
// g + 8's eight bits above (g = lane / 4).
MT_KEEP_LANES_FN int column_word_half(int64_t wk0) { return int(wk0 % 64) / 32; }
MT_KEEP_LANES_FN int column_word_shift(int64_t wk0, int lane) { return int(wk0 % 32) + lane / 4; }

// The dK/dV kernel's blocks are transposed: rows are keys, columns queries, element (r, c) at
// idx0 + c·stride + r, so a Philox block holds 4 rows of one column (rows 4a .. 4a + 3), and
// its verdicts belong to the four lanes g = 4(a % 2) + j (j < 4) of one t, rows g + 8(a / 2).
// The 4 lanes u = g % 4 of a group (g / 4, t) need the same 32 blocks (a = g / 4 + 2h, the 16
// columns of t): lane u draws the 8 whose column tile n has n % 4 == u, block i = 4h + 2(n / 4)
// + b into nibble i of one word, and every lane of the group reads the 4 words (by shuffles
// from column_source_lane) and keeps bit u of each nibble: one register in all.
struct ColumnKeeps {
  uint32_t bits = 0u;  // bit 4i + k: block i of the lane drawing column tiles n % 4 == k
};

MT_KEEP_LANES_FN int column_block_index(int n, int e) { return 4 * (e / 2) + 2 * (n / 4) + (e & 1); }
MT_KEEP_LANES_FN bool kept(const ColumnKeeps& k, int n, int e) {
  return (k.bits >> (4 * column_block_index(n, e) + n % 4)) & 1u;
}
// Block i (< 8) that lane draws: its first row (4a) and its column.
MT_KEEP_LANES_FN int column_drawn_row(int lane, int i) { return 4 * ((lane / 16) + 2 * (i / 4)); }
MT_KEEP_LANES_FN int column_drawn_column(int lane, int i) {
  return 8 * (4 * ((i / 2) % 2) + (lane / 4) % 4) + 2 * (lane % 4) + (i % 2);
}
// The lane of this lane's group that draws the blocks of column tiles n % 4 == k.
MT_KEEP_LANES_FN int column_source_lane(int lane, int k) { return 4 * (4 * (lane / 16) + k) + lane % 4; }
// This lane's verdicts in the word received from source k, as ColumnKeeps holds them.
MT_KEEP_LANES_FN uint32_t column_bits_from(int lane, int k, uint32_t word) {
  return ((word >> ((lane / 4) % 4)) & 0x11111111u) << k;
}
// Element (n, e)'s verdict set directly (rows that do not start a block; bits read back).
MT_KEEP_LANES_FN void set_kept(ColumnKeeps& k, int n, int e, bool keep) {
  if (keep) k.bits |= 1u << (4 * column_block_index(n, e) + n % 4);
}

}  // namespace mt::cuda::keep_lanes
