#pragma once
#include <cstdint>

#include "meshtrain/core/array.h"

namespace mt::cpu {

// Softmax (log_softmax when `log`) of x viewed as (outer, R, inner), along R. Max-shifted
// and computed in f32 (sums in double) for every float dtype; y has x's dtype.
void softmax_forward(const Array& x,  // (outer, R, inner)
                     Array& y,        // (outer, R, inner)
                     int64_t outer, int64_t r, int64_t inner, bool log);

}  // namespace mt::cpu
