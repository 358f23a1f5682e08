#pragma once
// Batches padded to their longest row instead of a fixed length (HF's DataCollatorWithPadding,
// TRL's padding): a collate builds its rows at the fixed length, right-padded, then keeps only
// the columns up to the batch's last real one. In a model whose padded positions are masked
// out (a key-padding mask) or come after everything that reads them (a causal decoder whose
// padded positions hold no target), the result is the same up to rounding, on fewer
// positions. With several data ranks the Trainer pads the slices back to the ranks' longest
// (batch_shapes.h).
#include <cstdint>
#include <vector>

namespace mt::train {

// The columns that `n` rows of `width` values (row-major, right-padded with `padding`) need:
// through the last column holding another value in any row, rounded up to a multiple of
// `multiple` (> 0), at least `multiple` and at most `width`.
int64_t columns_in_use(const std::vector<int64_t>& rows, int64_t n, int64_t width, int64_t padding, int64_t multiple);

// Keeps the first `keep` (<= width) columns of each of the `n` rows, in place.
void keep_columns(std::vector<int64_t>& rows, int64_t n, int64_t width, int64_t keep);

}  // namespace mt::train
