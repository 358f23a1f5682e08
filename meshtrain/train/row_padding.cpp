#include "meshtrain/train/row_padding.h"

#include <algorithm>

#include "meshtrain/core/error.h"

namespace mt::train {

int64_t columns_in_use(const std::vector<int64_t>& rows, int64_t n, int64_t width, int64_t padding, int64_t multiple) {
  MT_CHECK(multiple > 0 && n >= 0 && width >= 0 && int64_t(rows.size()) == n * width, "[collate] ", rows.size(),
           " values are not ", n, " rows of ", width, ", or the multiple ", multiple, " is not positive");
  int64_t used = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = width; c > used; --c)  // from the right, down to the widest row seen so far
      if (rows[size_t(r * width + c - 1)] != padding) {
        used = c;
        break;
      }
  return std::min(width, std::max<int64_t>(1, (used + multiple - 1) / multiple) * multiple);
}

void keep_columns(std::vector<int64_t>& rows, int64_t n, int64_t width, int64_t keep) {
  MT_CHECK(keep >= 0 && keep <= width && int64_t(rows.size()) == n * width, "[collate] cannot keep ", keep, " of ",
           width, " columns of ", rows.size(), " values");
  if (keep == width) return;
  // Row r moves to r·keep, never past where it starts (r·width): forward copies are safe.
  for (int64_t r = 0; r < n; ++r) std::copy_n(rows.begin() + r * width, keep, rows.begin() + r * keep);
  rows.resize(size_t(n * keep));
}

}  // namespace mt::train
