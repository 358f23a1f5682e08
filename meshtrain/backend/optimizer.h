#pragma once
// Optimizer updates in few passes over a parameter's elements (the role of PyTorch's
// foreach/fused AdamW): cpu/optimizer.cpp and cuda/optimizer.cu. The moments in one pass that
// reads g, m, v once and writes m', v' once, the update in a second, instead of one memory pass
// per elementwise op.
#include <cstdint>
#include <vector>

#include "meshtrain/core/array.h"

namespace mt::kernels {

// The constants of an Adam run: the same for every step, so they ride in the launch.
struct AdamHyper {
  float b1, b2;  // moment decay rates
  float one_minus_b1, one_minus_b2;
  float eps;
};

// The values that change from step to step are read from device memory, an f32 array of
// kAdamScalarCount the host rewrites before each step: a launch then carries nothing that
// differs between steps, so a captured step replays with the next step's learning rate.
enum AdamScalar : int {
  kAdamStepSize = 0,  // lr / (1 - b1^t)
  kAdamSqrtBc2 = 1,   // sqrt(1 - b2^t)
  kAdamDecay = 2,     // lr · weight_decay, for the tensors that decay
  kAdamScalarCount = 3
};

// The elements of one tensor whose squares sum_squares_multi adds up in f64 before adding the
// tiles' sums, on both backends.
constexpr int64_t kSumSquaresTile = 4096;

}  // namespace mt::kernels

// adam_moments: out [2, n] f32 = (m', v') for f32 g, m, v: m' = b1·m + (1-b1)·g, v' = b2·v + (1-b2)·g².
// adam_direction: out f32 = -(m / (sqrt(v) / sqrt_bc2 + eps)) · step_size - decay · p (p decays
//   and is read when given), torch's order of operations; step_size, sqrt_bc2 and decay from
//   `scalars` (f32 [kAdamScalarCount] on the tensors' device).
// The multi-tensor forms take k tensors in one call (one launch per few dozen tensors on the GPU,
// their pointers in the launch's parameters) and write one flat result; tensor j's elements
// start at the sum of the numels before it. Element for element they compute what the
// single-tensor kernels compute.
// adam_moments_multi: in = g_0..g_{k-1}, m_0.., v_0..; out [2, total]: row 0 the m's, row 1 the
//   v's. out may be the buffer the m's and v's are views of (each element is read before it is
//   written).
// adam_direction_multi: in = m_0..m_{k-1}, v_0.., p_0..; tensor j's update written to outs[j]
//   (f32, its shape; distinct buffers, possibly views of one flat array); tensor j decays where
//   decays[j] (p_j is read only there).
// Gradient clipping and the updates' application over a whole tree in one pass each (torch's
// foreach norm, mul_ and add_), where the composed ops took up to four ops per tensor:
// sum_squares_multi: out f32 [] = Σ_j Σ_i x_j[i]² over k arrays of one floating dtype. Each square
//   is rounded to f32 (as square() of the f32 value rounds it), summed in f64 over tiles of
//   kSumSquaresTile elements of one tensor, and the tiles' sums are added: the result depends
//   neither on the thread count nor on the order blocks run in. The CPU adds in order; the GPU
//   adds within a tile and over the tiles by fixed trees, so the two may differ in the f64
//   sum's last bits (and the f32 norm by an ulp).
// scale_multi: outs[j] = in[j] · scale[0], the product in f32 rounded to the arrays' dtype;
//   scale is an f32 array of one element on the tensors' device (read there: a GPU launch
//   carries no value that changes from step to step). outs[j] may be in[j].
// add_multi (the updates' application, optim::apply_updates): in = a_0..a_{k-1}, b_0..b_{k-1}
//   of one dtype, outs[j] = a_j + b_j, the sum in f32 rounded to the dtype. outs[j] may be a_j.
// cast_multi (mixed precision's casts of the weights, once per step): outs[j] = in[j] in the
//   outs' floating dtype, rounded as cast rounds; one launch per table of tensors on the GPU,
//   where a cast per parameter was a launch each (150 for GPT-2, 200 for BERT).
#define MT_OPTIMIZER_KERNELS                                                                                   \
  void adam_moments(const Array& g, const Array& m, const Array& v, const kernels::AdamHyper& h, Array& out);  \
  void adam_direction(const Array& m, const Array& v, const Array* p, const kernels::AdamHyper& h,                \
                      const Array& scalars, Array& out);                                                      \
  void adam_moments_multi(const std::vector<Array>& in, const kernels::AdamHyper& h, Array& out);              \
  void adam_direction_multi(const std::vector<Array>& in, const std::vector<uint8_t>& decays,                 \
                            const kernels::AdamHyper& h, const Array& scalars, std::vector<Array>& outs);    \
  void sum_squares_multi(const std::vector<Array>& in, Array& out);                                          \
  void scale_multi(const std::vector<Array>& in, const Array& scale, std::vector<Array>& outs);             \
  void add_multi(const std::vector<Array>& in, std::vector<Array>& outs);                                   \
  void cast_multi(const std::vector<Array>& in, std::vector<Array>& outs);

namespace mt::cpu { MT_OPTIMIZER_KERNELS }
namespace mt::cuda { MT_OPTIMIZER_KERNELS }
