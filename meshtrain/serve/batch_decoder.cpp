#include "meshtrain/serve/batch_decoder.h"

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/models/decoding.h"

namespace mt::serve {

BatchDecoder::BatchDecoder(models::CausalLm lm) : lm_(std::move(lm)) {
  MT_CHECK(lm_.forward, "[serve] the model has no forward function");
  MT_CHECK(lm_.vocab_size > 0, "[serve] the model's vocab_size is ", lm_.vocab_size);
  models::KvCache probe;
  prefill({0}, probe);
  kv_bytes_per_token_ = probe.nbytes();
  MT_CHECK(kv_bytes_per_token_ > 0, "[serve] the model filled no KV cache: it cannot decode incrementally");
}

std::vector<float> BatchDecoder::prefill(const std::vector<int64_t>& prompt, models::KvCache& cache) const {
  MT_CHECK(!prompt.empty(), "[serve] empty prompt");
  autodiff::NoGradGuard no_grad;
  cache.clear();
  const int64_t n = int64_t(prompt.size());
  models::DecoderInputs in;
  in.input_ids = Array::from_vector(prompt, Shape{1, n});
  in.attention_mask = Array::full(Shape{1, n}, 1.0, DType::i64);
  return models::last_logits(lm_.forward(in, &cache), 1, lm_.vocab_size);
}

std::vector<float> BatchDecoder::decode(const std::vector<models::KvCache*>& caches,
                                        const std::vector<int64_t>& tokens) const {
  MT_CHECK(!caches.empty() && caches.size() == tokens.size(), "[serve] decode step of ", caches.size(),
           " caches and ", tokens.size(), " tokens");
  autodiff::NoGradGuard no_grad;
  const int64_t b = int64_t(tokens.size());
  std::vector<int64_t> positions;
  positions.reserve(tokens.size());
  for (models::KvCache* c : caches) positions.push_back(c->length());
  models::KvCache step;
  step.rows = caches;
  models::DecoderInputs in;
  in.input_ids = Array::from_vector(tokens, Shape{b, 1});
  in.position_ids = Array::from_vector(positions, Shape{b, 1});
  return models::last_logits(lm_.forward(in, &step), b, lm_.vocab_size);
}

}  // namespace mt::serve
