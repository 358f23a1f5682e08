#pragma once
// A language model's output layer and its loss as one op: the (N, V) logits are made a chunk
// of rows at a time and never held whole, in any dtype.
#include <cstdint>

#include "meshtrain/core/array.h"
#include "meshtrain/ops/loss.h"

namespace mt {

// The logits a chunk of linear_cross_entropy holds by default (128 MiB in bf16): few enough
// chunks that summing the weight's gradient over them costs little next to the GEMMs.
inline constexpr int64_t kLinearCrossEntropyChunk = int64_t(1) << 26;

// cross_entropy(matmul(hidden, weight, false, true) [+ bias], labels, ignore_index,
// label_smoothing, reduction): hidden (..., C), weight (V, C) and the optional bias (V,) of
// hidden's dtype (the bias added in the product's epilogue, its gradient the logits' gradients
// summed over the rows in f32), integer labels of shape hidden.shape[:-1]; an f32 scalar. The rows are taken `chunk_logits / V` at a time (at least
// one): each chunk's logits are made, reduced to the loss and, when a gradient is wanted, turned
// at once into the chunk's share of the hidden states' and the weight's gradients (the weight's
// summed over the chunks in f32), so the backward pass only scales them by the cotangent. Peak
// memory is two chunks of logits instead of the logits, their gradient and the loss's f32
// copies; the forward pass does the backward's GEMMs. Matmuls follow the matmul precision in
// force, as matmul()'s. Rows split over mesh axes (data parallel) run it per rank on their
// rows, with a weight split over those axes (FSDP) gathered for it and its gradient
// reduce-scattered back; the mean is then the summed loss over the count of targets. Falls
// back to the composed form (same values) where the chunked one does not apply:
// Reduction::none, a weight or bias split over an axis the rows do not use (the
// tensor-parallel head: the vocabulary-parallel loss), f16 arrays, and nested differentiation.
Array linear_cross_entropy(const Array& hidden, const Array& weight, const Array& labels, int64_t ignore_index = -100,
                           double label_smoothing = 0.0, Reduction reduction = Reduction::mean,
                           int64_t chunk_logits = kLinearCrossEntropyChunk, const Array& bias = Array());

// The multiple linear_cross_entropy pads the vocabulary to inside its GEMMs on a device kind
// (`gpu` or the CPU): cuBLASLt's fastest kernels want 16-byte aligned rows, which an odd V
// (GPT-2's 50257) denies the logits and their gradient, so on a GPU the weight gets zero rows
// up to a multiple of 128 (50304), the loss kernels skip the logits' extra columns and the
// weight's gradient drops its extra rows; results, files and the reported vocabulary are
// unchanged. 1 (none) on the CPU, whose GEMMs gain nothing from it. MT_PAD_VOCAB=0 in the
// environment turns the GPU's off (to measure it); tests set either.
int64_t vocab_pad_multiple(bool gpu);
void set_vocab_pad_multiple(bool gpu, int64_t multiple);

}  // namespace mt
