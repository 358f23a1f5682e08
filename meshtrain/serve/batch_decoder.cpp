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
  in.logits_to_keep = 1;  // only the next token's
  return models::last_logits(lm_.forward(in, &cache), 1, lm_.vocab_size);
}

std::vector<float> BatchDecoder::prefill_batch(const std::vector<std::vector<int64_t>>& prompts,
                                               models::KvCache& cache) const {
  MT_CHECK(!prompts.empty(), "[serve] no prompts to prefill");
  if (prompts.size() == 1) return prefill(prompts[0], cache);
  autodiff::NoGradGuard no_grad;
  cache.clear();
  const int64_t b = int64_t(prompts.size());
  int64_t t = 0;
  for (const auto& p : prompts) {
    MT_CHECK(!p.empty(), "[serve] empty prompt");
    t = std::max(t, int64_t(p.size()));
  }
  std::vector<int64_t> ids(size_t(b * t), 0), mask(size_t(b * t), 0);
  for (int64_t i = 0; i < b; ++i) {
    const std::vector<int64_t>& p = prompts[size_t(i)];
    const int64_t pad = t - int64_t(p.size());
    std::copy(p.begin(), p.end(), ids.begin() + i * t + pad);
    std::fill(mask.begin() + i * t + pad, mask.begin() + (i + 1) * t, 1);
  }
  models::DecoderInputs in;
  in.input_ids = Array::from_vector(ids, Shape{b, t});
  in.attention_mask = Array::from_vector(mask, Shape{b, t});
  in.logits_to_keep = 1;  // left-padded: every row's last position is the batch's last
  return models::last_logits(lm_.forward(in, &cache), b, lm_.vocab_size);
}

std::vector<float> BatchDecoder::decode(models::PagedKvStep& step, const std::vector<int64_t>& tokens) const {
  MT_CHECK(!tokens.empty() && tokens.size() == step.rows.lengths.size(), "[serve] decode step of ",
           step.rows.lengths.size(), " rows and ", tokens.size(), " tokens");
  autodiff::NoGradGuard no_grad;
  const int64_t b = int64_t(tokens.size());
  std::vector<int64_t> positions;
  positions.reserve(tokens.size());
  for (int64_t length : step.rows.lengths) positions.push_back(length - 1);
  models::KvCache cache;
  cache.paged = &step;
  models::DecoderInputs in;
  in.input_ids = Array::from_vector(tokens, Shape{b, 1});
  in.position_ids = Array::from_vector(positions, Shape{b, 1});
  return models::last_logits(lm_.forward(in, &cache), b, lm_.vocab_size);
}

}  // namespace mt::serve
