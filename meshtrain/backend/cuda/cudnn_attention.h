#pragma once
// Flash attention through cuDNN's fused attention engine (issue 44's attention lever: cuDNN 9's
// flash kernels for Hopper and Ampere run at several times the rate of the mma.sync kernels
// of attention_tensor_core.cu), with the graphs of cudnn_attention_graphs.h. The log-sum-exp
// the forward writes is flash_attention_forward's (natural log of Σ exp(scale · q·k) over
// visible keys), so without dropout either backward takes either forward; with dropout the
// backward follows its forward's record (FlashAttentionShape::cudnn_dropout_seed).
//
// Opt-in until a GPU run has compared it with the kernels here: MT_ATTENTION_CUDNN=1 for
// attention without dropout, =all with dropout too, where cuDNN draws its own mask (from a
// seed the dropout key gives; not dropout()'s Philox stream, so a run no longer draws the
// CPU's masks), and then the forward and the backward both run on cuDNN or neither does (a
// backward that cannot follow its forward there fails saying why). It takes bf16 and f16
// arrays, head dims that are multiples of 8 up to 128, grouped-query heads, causal only where
// Tq == Tk, and 16-byte aligned rows. A key-padding mask (bf16 arrays, Tk a multiple of 8, not
// causal: the op takes none with it either) goes to cuDNN as an additive bias (0, or bf16's
// lowest for a masked key); the batches whose mask row unmasks no key then run on the
// tensor-core kernels after cuDNN, on the device's own verdict (cudnn_key_mask_bias), so they
// attend uniformly as FlashAttentionShape says.
// Elsewhere, and where cuDNN refuses a shape (said once per shape on stderr, with cuDNN's
// reason), the caller runs its own kernels.
#include <string>

#include "meshtrain/backend/attention.h"
#include "meshtrain/core/array.h"

namespace mt::cuda {

// MT_ATTENTION_CUDNN in the environment (read at each call, as the tests toggle it): unset or
// 0 off, 1 without dropout, all with dropout too, auto (`measured`) the calls 1 takes, each
// shape's forward and backward run where its first calls measured them faster: cuDNN or the
// tensor-core kernels (measured_route.h: one warm-up and three timed calls each, alternating,
// cuDNN taken only when more than 5 % faster, as the kernels' results are reproducible and
// cuDNN's dQ is not; the choice said once per shape on stderr; inside a captured step nothing
// is timed and an undecided shape keeps the kernels). Another value is an error naming these.
enum class CudnnAttentionMode { off, without_dropout, all, measured };
CudnnAttentionMode cudnn_attention_mode();

// Why the route does not take these arrays in `mode`, or "" when it does.
std::string cudnn_attention_ineligibility(const Array& q, const Array& k, const Array& v, const Array& out,
                                          const kernels::FlashAttentionShape& s,
                                          CudnnAttentionMode mode = CudnnAttentionMode::without_dropout);

// seed_offset[0] = cuDNN's dropout seed for `key`, [2] = its offset (0): an i64 array of 3 or
// more on the GPU, written by a kernel that reads the key's last fold when it runs
// (cudnn_dropout_seed.cu).
void cudnn_dropout_seed(const RngKey& key, Array& seed_offset);

// bias (mask_batches, rows, Tk) bf16: each of its `rows` rows per batch 0 where key_mask (device
// memory, (mask_batches, Tk)) unmasks the key, else kMaskedScore (bf16's lowest);
// no_visible_key[b] (i32) = 1 for each batch b < no_visible_key's size whose mask row (row 0
// for all when mask_batches is 1) unmasks no key, else 0.
void cudnn_key_mask_bias(const bool* key_mask, int64_t mask_batches, int64_t tk, int64_t rows, Array& bias,
                         Array& no_visible_key);

// Run through cuDNN where enabled, eligible and planned: true when it ran (the outputs
// written), false when the caller's kernels must run.
bool cudnn_attention_forward(const Array& q, const Array& k, const Array& v, const kernels::FlashAttentionShape& s,
                             Array& out, Array& lse);
bool cudnn_attention_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                              const Array& g, const kernels::FlashAttentionShape& s, Array& dq, Array& dk, Array& dv);

}  // namespace mt::cuda
