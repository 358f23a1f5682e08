#include "meshtrain/posttrain/token_logprobs.h"

#include <algorithm>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/core/error.h"
#include "meshtrain/models/chunked_lm_loss.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::posttrain {

Array target_mask(const Array& labels) { return cast(ne(labels, scalar_like(labels, -100)), DType::f32); }

Array token_logprobs(const Array& logits, const Array& labels, double temperature) {
  MT_CHECK(logits.ndim() == 3 && labels.ndim() == 2 && labels.dim(0) == logits.dim(0) && labels.dim(1) == logits.dim(1),
           "[token_logprobs] logits ", logits.shape().str(), " and labels ", labels.shape().str(),
           " must be (B, T, V) and (B, T)");
  MT_CHECK(!is_floating(labels.dtype()), "[token_logprobs] labels must be integer ids, got ", dtype_name(labels.dtype()));
  MT_CHECK(temperature > 0, "[token_logprobs] the temperature must be positive, got ", temperature);
  const Array f = cast(logits, DType::f32);
  const Array x = temperature == 1.0 ? f : div(f, scalar_like(f, temperature));
  const Array targeted = ne(labels, scalar_like(labels, -100));
  // Ignored positions read id 0 and are zeroed after: the gather needs an id everywhere.
  const Array ids = where(targeted, labels, zeros_like(labels));
  const Array picked = squeeze(take_along_axis(x, expand_dims(ids, 2), 2), 2);
  const Array lp = sub(picked, logsumexp(x, {2}));
  return where(targeted, lp, zeros_like(lp));
}

Array sequence_logprobs(const Array& logits, const Array& labels) { return sum(token_logprobs(logits, labels), {1}); }

Array decoder_token_logprobs(const models::PretrainedModel& model, const Params& p, const models::DecoderInputs& in,
                             const Array& labels, const RngKey& dropout_key, bool train, double temperature) {
  if (model.config.remat() != Remat::full)
    return token_logprobs(model.decoder_logits(p, in, dropout_key, train), labels, temperature);
  const models::ModelSpec& s = model.spec();
  const Array hidden = s.decoder_hidden(model.config, p, in, dropout_key, train);
  const Params head_params = models::head_params_of(s.head_prefixes, p);
  const int64_t t = hidden.dim(1);
  const int64_t positions =
      models::head_chunk_positions(hidden.dim(0), t, models::head_vocab(head_params), models::kChunkLogits);
  const models::ModelConfig config = model.config;
  auto chunk = [config, &s, dropout_key, train, temperature](const Params& hp, const std::vector<Array>& xs) {
    return token_logprobs(s.decoder_head(config, hp, xs[0], dropout_key, train), xs[1], temperature);
  };
  std::vector<Array> parts;
  for (int64_t t0 = 0; t0 < t; t0 += positions) {
    const int64_t t1 = std::min(t, t0 + positions);
    parts.push_back(checkpoint(chunk, head_params, {slice(hidden, 1, t0, t1), slice(labels, 1, t0, t1)}));
  }
  return parts.size() == 1 ? parts[0] : concatenate(parts, 1);
}

}  // namespace mt::posttrain
