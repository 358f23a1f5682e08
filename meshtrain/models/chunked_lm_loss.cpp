#include "meshtrain/models/chunked_lm_loss.h"

#include <algorithm>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

Params head_params_of(const std::vector<std::string>& head_prefixes, const Params& p) {
  Params head;
  for (const std::string& prefix : head_prefixes)
    for (const auto& [path, value] : p.with_prefix(prefix)) head.set(path, value);
  return head;
}

int64_t head_vocab(const Params& head_params) {
  int64_t vocab = 1;
  for (const auto& [path, w] : head_params)
    if (w.ndim() == 2) vocab = std::max(vocab, w.dim(0));
  return vocab;
}

int64_t head_chunk_positions(int64_t batch, int64_t positions, int64_t vocab, int64_t chunk_logits) {
  return std::clamp<int64_t>(chunk_logits / std::max<int64_t>(1, batch * vocab), 1,
                             std::max<int64_t>(1, (positions + 3) / 4));
}

Array chunked_lm_loss(const Array& hidden, const Array& labels, const HeadFn& head, const Params& head_params,
                      int64_t chunk_logits) {
  MT_CHECK(hidden.ndim() == 3 && labels.ndim() == 2 && labels.dim(0) == hidden.dim(0) && labels.dim(1) == hidden.dim(1),
           "[chunked_lm_loss] hidden ", hidden.shape().str(), " and labels ", labels.shape().str(),
           " must be (B, T, C) and (B, T)");
  const int64_t t = hidden.dim(1);
  const int64_t positions = head_chunk_positions(hidden.dim(0), t, head_vocab(head_params), chunk_logits);
  auto chunk_sum = [head](const Params& hp, const std::vector<Array>& xs) {
    return cross_entropy(head(hp, xs[0]), xs[1], -100, 0.0, Reduction::sum);
  };
  Array total;
  for (int64_t t0 = 0; t0 < t; t0 += positions) {
    const int64_t t1 = std::min(t, t0 + positions);
    Array part = checkpoint(chunk_sum, head_params, {slice(hidden, 1, t0, t1), slice(labels, 1, t0, t1)});
    total = total.defined() ? add(total, part) : part;
  }
  return target_mean(total, labels, -100);
}

}  // namespace mt::models
