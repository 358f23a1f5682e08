#include "meshtrain/ops/index_checks.h"

#include <utility>

#include "meshtrain/backend/indexing.h"
#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/core/error.h"

namespace mt {

CheckMessage index_range_message(const char* op, int64_t size, const Shape& indices,
                                 std::function<std::string()> context) {
  return [op, size, indices, context = std::move(context)](int64_t position, int64_t value) {
    return detail::concat("[", op, "] index ", value, " out of range [0, ", size, ") at flat position ", position,
                          " of indices ", indices.str(), "; ", context());
  };
}

Array checked_indices(const Array& idx, int64_t size, const char* op, CheckMessage message, int64_t skip) {
  Array first = Array::empty(Shape{}, DType::i64, idx.device());
  DeferredChecks* deferred = DeferredChecks::current();
  // Nothing to index (size 0): no index is in range and 0 is no safe stand-in, so the verdict
  // is read at once even inside a scope.
  if (!deferred || (size == 0 && idx.numel() > 0)) {
    MT_KERNEL(idx, index_verdict, idx, size, skip, first, nullptr, op);
    settle_now({first, idx, std::move(message), size, skip});
    return idx;
  }
  Array safe = Array::empty(idx.shape(), idx.dtype(), idx.device());
  MT_KERNEL(idx, index_verdict, idx, size, skip, first, &safe, op);
  deferred->record({first, idx, std::move(message), size, skip});
  return safe;
}

}  // namespace mt
