#pragma once
// Index validation before a kernel reads indices (gathers, scatters, embeddings, one-hot, the
// cross-entropy's labels). Outside a DeferredChecks scope the verdict is read at once and a bad
// index throws before any kernel runs; inside one (a Trainer step) it is recorded and read with
// the loss, and the kernels read a copy with the bad entries zeroed (ops/deferred_checks.h).
#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "meshtrain/core/array.h"
#include "meshtrain/ops/deferred_checks.h"

namespace mt {

// No index value is exempt from the range check.
inline constexpr int64_t kNoSkip = std::numeric_limits<int64_t>::min();

// "[op] index v out of range [0, size) at flat position j of indices (shape); context".
// `context` (the shapes involved) runs only when a check fails: nothing is formatted on the
// ops' path otherwise.
CheckMessage index_range_message(const char* op, int64_t size, const Shape& indices,
                                 std::function<std::string()> context);

// Checks idx (i32/i64) against [0, size), values equal to `skip` excepted; returns the indices
// the kernels read: idx itself, or inside a DeferredChecks scope a copy whose bad entries are 0.
Array checked_indices(const Array& idx, int64_t size, const char* op, CheckMessage message, int64_t skip = kNoSkip);

}  // namespace mt
