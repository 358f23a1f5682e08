#pragma once
// The rotary position embedding kernel: cpu/rotary.cpp and cuda/rotary.cu. Rotates each pair
// (a, b) of x's last dim by its position's angle, read from cos and sin tables in x's dtype
// (which the op forms): a' = a·cos − b·sin, b' = b·cos + a·sin, each product and each sum
// rounded to x's dtype as the composed mul, sub and add round them, so the result equals the
// composed form bit for bit (no FMA contraction). `inverse` rotates by the opposite angle
// (sin negated): the backward, since a rotation's transpose is its inverse; it writes no
// negative zeros (adds +0), as the composed backward's sum of two zero-padded halves does not.
#include <cstdint>

#include "meshtrain/core/array.h"

namespace mt::kernels {

struct RotaryShape {
  // x read as (outer, T, inner, D) rows of D: heads-inner (B, T, H, D) is outer B, inner H;
  // (B, H, T, D) is outer B·H, inner 1; (..., T, D) is outer the leading dims' product.
  int64_t outer = 0, t = 0, inner = 1, d = 0;
  // Tables (T, D/2), or (B, T, D/2) per batch row (positions (B, T)): outer index o reads row
  // (o / outer_per_batch)·T + t of them then.
  bool per_batch = false;
  int64_t outer_per_batch = 1;
  int64_t batches = 1;  // the tables' batch rows: B with per-batch positions, else 1
  bool interleaved = false;  // pairs (x_2i, x_2i+1) as llama2.c, else (x_i, x_i+D/2) as Hugging Face
  bool inverse = false;
};

}  // namespace mt::kernels

// rotary: out (x's shape and dtype) = x rotated; cos, sin (T or B·T rows of D/2) in x's dtype.
#define MT_ROTARY_KERNELS \
  void rotary(const Array& x, const Array& cos, const Array& sin, const kernels::RotaryShape& s, Array& out);

namespace mt::cpu { MT_ROTARY_KERNELS }
namespace mt::cuda { MT_ROTARY_KERNELS }
