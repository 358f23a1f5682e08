#pragma once
// Flash attention through cuDNN's fused attention engine (issue 44's attention lever: cuDNN 9's
// flash kernels for Hopper and Ampere run at several times the rate of the mma.sync kernels
// of attention_tensor_core.cu), with the graphs of cudnn_attention_graphs.h. The log-sum-exp
// the forward writes is flash_attention_forward's (natural log of Σ exp(scale · q·k) over
// visible keys), so either backward takes either forward.
//
// Opt-in (MT_ATTENTION_CUDNN=1) until a GPU run has compared it with the kernels here. It
// takes bf16 and f16 arrays, head dims that are multiples of 8 up to 128, no dropout and no
// key-padding mask, causal only where Tq == Tk, 16-byte aligned rows, and for the backward one
// key/value head per query head. Elsewhere, and where cuDNN refuses a shape (said once per
// shape on stderr, with cuDNN's reason), the caller runs its own kernels.
#include <string>

#include "meshtrain/backend/attention.h"
#include "meshtrain/core/array.h"

namespace mt::cuda {

// Why the route does not take these arrays' forward, or "" when it does (the switch aside);
// the backward also needs kv_heads == heads (cudnn_attention_backward checks).
std::string cudnn_attention_ineligibility(const Array& q, const Array& k, const Array& v, const Array& out,
                                          const kernels::FlashAttentionShape& s);
// MT_ATTENTION_CUDNN=1 in the environment (read at each call, as the tests toggle it).
bool cudnn_attention_enabled();

// Run through cuDNN where enabled, eligible and planned: true when it ran (the outputs
// written), false when the caller's kernels must run.
bool cudnn_attention_forward(const Array& q, const Array& k, const Array& v, const kernels::FlashAttentionShape& s,
                             Array& out, Array& lse);
bool cudnn_attention_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                              const Array& g, const kernels::FlashAttentionShape& s, Array& dq, Array& dk, Array& dv);

}  // namespace mt::cuda
