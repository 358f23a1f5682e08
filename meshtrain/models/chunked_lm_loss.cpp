#include "meshtrain/models/chunked_lm_loss.h"

#include <algorithm>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

Array chunked_lm_loss(const Array& hidden, const Array& labels, const HeadFn& head, const Params& head_params,
                      int64_t chunk_logits) {
  MT_CHECK(hidden.ndim() == 3 && labels.ndim() == 2 && labels.dim(0) == hidden.dim(0) && labels.dim(1) == hidden.dim(1),
           "[chunked_lm_loss] hidden ", hidden.shape().str(), " and labels ", labels.shape().str(),
           " must be (B, T, C) and (B, T)");
  const int64_t b = hidden.dim(0), t = hidden.dim(1);
  // Only sizes the chunks: the head's widest matrix ([vocab, C] for every model here).
  int64_t vocab = 1;
  for (const auto& [path, w] : head_params)
    if (w.ndim() == 2) vocab = std::max(vocab, w.dim(0));
  // At most chunk_logits per chunk, and at least 4 chunks, so the logits never exist whole.
  const int64_t positions =
      std::clamp<int64_t>(chunk_logits / std::max<int64_t>(1, b * vocab), 1, std::max<int64_t>(1, (t + 3) / 4));
  auto chunk_sum = [head](const Params& hp, const std::vector<Array>& xs) {
    return cross_entropy(head(hp, xs[0]), xs[1], -100, 0.0, Reduction::sum);
  };
  Array total;
  for (int64_t t0 = 0; t0 < t; t0 += positions) {
    const int64_t t1 = std::min(t, t0 + positions);
    Array part = checkpoint(chunk_sum, head_params, {slice(hidden, 1, t0, t1), slice(labels, 1, t0, t1)});
    total = total.defined() ? add(total, part) : part;
  }
  Array counted = sum(cast(ne(labels, scalar_like(labels, -100)), total.dtype()));
  return div(total, counted);
}

}  // namespace mt::models
