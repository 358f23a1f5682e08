#pragma once
// Losses. cross_entropy is fused (one f32 log-sum-exp pass forward, one pass backward);
// cross_entropy_reference is the same loss composed from ops, used to test it and, inside
// the VJP, under nested differentiation so second-order gradients stay exact.
#include <cstdint>

#include "meshtrain/core/array.h"

namespace mt {

enum class Reduction { mean, sum, none };

// torch.nn.functional.cross_entropy with classes on the LAST axis: logits (N, C) or
// (B, T, C) (any rank >= 1), integer labels of shape logits.shape[:-1].
// Per target: (1 - ε)·(−log p_y) + ε·mean_c(−log p_c); targets equal to ignore_index add
// nothing, and mean divides by the number of the others (NaN when there are none, as torch).
// The result is f32 whatever the logits dtype (losses accumulate in f32); the gradient has
// the logits' dtype. A label outside [0, C) other than ignore_index throws mt::Error.
Array cross_entropy(const Array& logits, const Array& labels, int64_t ignore_index = -100, double label_smoothing = 0.0,
                    Reduction reduction = Reduction::mean);
// A summed loss over the count of `labels` not equal to `ignore_index` (both totals over every
// rank when the rows are split): the mean over split rows. As the one-device op, the value is
// NaN when every target is ignored and the gradient is then 0.
Array target_mean(const Array& total, const Array& labels, int64_t ignore_index);
Array cross_entropy_reference(const Array& logits, const Array& labels, int64_t ignore_index = -100,
                              double label_smoothing = 0.0, Reduction reduction = Reduction::mean);

// torch.nn.functional.mse_loss: (pred - target)² reduced; same shapes required; computed and
// returned in f32 whatever the inputs' float dtypes, as under torch.autocast.
Array mse_loss(const Array& pred, const Array& target, Reduction reduction = Reduction::mean);

}  // namespace mt
