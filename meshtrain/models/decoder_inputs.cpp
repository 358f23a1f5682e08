#include "meshtrain/models/decoder_inputs.h"

#include <cmath>

#include "meshtrain/core/device_constants.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/models/kv_cache.h"

namespace mt::models {

Array arange_ids(int64_t start, int64_t n) {
  auto make = [&] {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + i;
    return Array::from_vector(v, Shape{n});
  };
  // A step's positions are made once per (start, n) and device, not uploaded by every forward;
  // a decoding step's single position changes every call and is not kept.
  if (n == 1) return make();
  return device_constant("arange_ids " + std::to_string(start) + " " + std::to_string(n), current_device(), make);
}

Array keep_last_positions(const Array& hidden, int64_t keep) {
  MT_CHECK(keep >= 0, "[decoder] logits_to_keep must be >= 0, got ", keep);
  MT_CHECK(hidden.ndim() == 3, "[decoder] hidden states ", hidden.str(), " must be (B, T, C)");
  const int64_t t = hidden.dim(1);
  if (keep == 0 || keep >= t) return hidden;
  return slice(hidden, 1, t - keep, t);
}

Array position_ids_from_mask(const Array& attention_mask, int64_t t) {
  MT_CHECK(attention_mask.ndim() == 2 && attention_mask.dim(1) >= t, "[position_ids] attention mask ",
           attention_mask.str(), " must be (B, P + T) with T = ", t);
  const int64_t tk = attention_mask.dim(1);
  // The running count of attended positions along each row, with device ops only (the mask is
  // never read to the host, so a step with padding does not wait for its stream): an inclusive
  // prefix sum in log2(P + T) shifted adds, in i64, exact at any length. A batch-sharded mask
  // stays sharded, and so do its positions.
  const Array on = attention_mask.dtype() == DType::boolean ? attention_mask
                                                            : ne(attention_mask, scalar_like(attention_mask, 0.0));
  Array count = cast(on, DType::i64);
  for (int64_t s = 1; s < tk; s *= 2) {
    const Array zeros = mul(slice(count, 1, 0, s), scalar_like(count, 0.0));
    count = add(count, concatenate({zeros, slice(count, 1, 0, tk - s)}, 1));
  }
  // A masked position gets 1 (as transformers' position_ids.masked_fill_(mask == 0, 1)).
  const Array last = slice(count, 1, tk - t, tk);
  return where(slice(on, 1, tk - t, tk), sub(last, scalar_like(last, 1.0)), scalar_like(last, 1.0));
}

Array padding_mask(const Array& attention_mask, const char* what) {
  if (!attention_mask.defined()) return Array();
  MT_CHECK(attention_mask.ndim() == 2, "[", what, "] attention_mask must be (B, T), got ", attention_mask.str());
  Array on = attention_mask.dtype() == DType::boolean ? attention_mask
                                                      : ne(attention_mask, scalar_like(attention_mask, 0.0));
  return reshape(on, {attention_mask.dim(0), 1, 1, attention_mask.dim(1)});
}

ResolvedDecoderInputs resolve_decoder_inputs(const DecoderInputs& in, const KvCache* cache, int64_t max_positions,
                                             const char* what) {
  ResolvedDecoderInputs r;
  MT_CHECK(in.input_ids.defined() && in.input_ids.ndim() == 2 && is_integer(in.input_ids.dtype()), "[", what,
           "] input_ids must be integer (B, T), got ", in.input_ids.defined() ? in.input_ids.str() : "undefined");
  const int64_t b = in.input_ids.dim(0), t = in.input_ids.dim(1);
  MT_CHECK(t > 0, "[", what, "] input_ids ", in.input_ids.str(), " has no positions");
  r.ids = in.input_ids;
  if (cache && cache->paged) {
    // Each row continues its own sequence: positions come from the caller, padding never exists.
    const std::vector<int64_t>& lengths = cache->paged->rows.lengths;
    MT_CHECK(int64_t(lengths.size()) == b && t == 1, "[", what, "] a paged KV cache of ", lengths.size(),
             " rows decodes one position per row, got input_ids ", in.input_ids.str());
    MT_CHECK(!in.attention_mask.defined(), "[", what, "] a paged KV cache takes no attention_mask");
    const Array& p = in.position_ids;
    MT_CHECK(p.defined() && is_integer(p.dtype()) && p.ndim() == 2 && p.dim(0) == b && p.dim(1) == t, "[", what,
             "] a paged KV cache needs position_ids (B, 1) for input_ids ", in.input_ids.str());
    for (size_t i = 0; i < lengths.size(); ++i)
      MT_CHECK(max_positions <= 0 || lengths[i] <= max_positions, "[", what, "] row ", i, ": ", lengths[i],
               " positions exceed the model's maximum of ", max_positions);
    r.positions = p;
    return r;
  }
  r.past = cache ? cache->length() : 0;
  if (cache && r.past > 0)
    MT_CHECK(cache->batch() == b, "[", what, "] KV cache holds batch ", cache->batch(), " but input_ids is ",
             in.input_ids.str());
  if (in.attention_mask.defined()) {
    MT_CHECK(in.attention_mask.ndim() == 2 && in.attention_mask.dim(0) == b && in.attention_mask.dim(1) == r.past + t,
             "[", what, "] attention_mask ", in.attention_mask.str(), " must be (B, past + T) = (", b, ", ",
             r.past + t, ") for input_ids ", in.input_ids.str(), " and ", r.past, " cached positions");
    r.mask = padding_mask(in.attention_mask, what);
  }
  if (in.position_ids.defined()) {
    const Array& p = in.position_ids;
    MT_CHECK(is_integer(p.dtype()) && ((p.ndim() == 2 && p.dim(0) == b && p.dim(1) == t) || (p.ndim() == 1 && p.dim(0) == t)),
             "[", what, "] position_ids ", p.str(), " must be integer (B, T) or (T,) for input_ids ",
             in.input_ids.str());
    r.positions = p;
  } else if (in.attention_mask.defined()) {
    r.positions = position_ids_from_mask(in.attention_mask, t);
  } else {
    r.positions = arange_ids(r.past, t);
  }
  if (max_positions > 0)
    MT_CHECK(r.past + t <= max_positions, "[", what, "] ", r.past + t, " positions (", r.past, " cached + ", t,
             " new) exceed the model's maximum of ", max_positions);
  return r;
}

}  // namespace mt::models
