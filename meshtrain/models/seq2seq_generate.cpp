#include "meshtrain/models/seq2seq_generate.h"

#include <algorithm>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/models/decoding.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

namespace {

// Encoded sources and each row's decoder tokens so far (all rows one length: the start
// token, then one token per step).
class Seq2SeqState final : public DecodingState {
 public:
  Seq2SeqState(const Seq2SeqLm& lm, EncoderOutput enc, bool use_cache)
      : lm_(lm), enc_(std::move(enc)), use_cache_(use_cache),
        seqs_(size_t(enc_.batch()), std::vector<int64_t>{lm.decoder_start_token_id}) {}
  int64_t rows() const override { return int64_t(seqs_.size()); }
  int64_t vocab_size() const override { return lm_.vocab_size; }
  const std::vector<int64_t>& sequence(int64_t row) const override { return seqs_[size_t(row)]; }

  // The newest token against the cache, or the whole target without one.
  std::vector<float> next_logits() override {
    const int64_t len = int64_t(seqs_[0].size()), n = use_cache_ ? len - cache_.length() : len;
    std::vector<int64_t> ids;
    for (const auto& s : seqs_) ids.insert(ids.end(), s.end() - n, s.end());
    Array logits = lm_.decode(Array::from_vector(ids, Shape{rows(), n}), enc_, use_cache_ ? &cache_ : nullptr);
    return last_logits(logits, rows(), lm_.vocab_size);
  }
  void append(const std::vector<int64_t>& tokens) override {
    for (size_t r = 0; r < seqs_.size(); ++r) seqs_[r].push_back(tokens[r]);
  }
  void select_rows(const std::vector<int64_t>& src) override {
    std::vector<std::vector<int64_t>> seqs;
    for (int64_t s : src) seqs.push_back(seqs_[size_t(s)]);
    seqs_ = std::move(seqs);
    enc_ = enc_.select_rows(src);
    if (use_cache_) cache_.select_rows(src);
  }

 private:
  const Seq2SeqLm& lm_;
  EncoderOutput enc_;
  bool use_cache_;
  std::vector<std::vector<int64_t>> seqs_;
  Seq2SeqCache cache_;
};

}  // namespace

Seq2SeqLm restrict_vocab(Seq2SeqLm lm, int64_t vocab_size) {
  MT_CHECK(vocab_size > 0 && vocab_size <= lm.vocab_size, "[generate] cannot restrict a vocabulary of ", lm.vocab_size,
           " to ", vocab_size);
  if (vocab_size == lm.vocab_size) return lm;
  auto decode = std::move(lm.decode);
  lm.decode = [decode, vocab_size](const Array& d, const EncoderOutput& e, Seq2SeqCache* c) {
    return slice(dist::to_host(decode(d, e, c)), 2, 0, vocab_size);
  };
  lm.vocab_size = vocab_size;
  return lm;
}

std::pair<Array, Array> right_pad(const std::vector<std::vector<int64_t>>& sources, int64_t pad_token_id) {
  MT_CHECK(!sources.empty(), "[right_pad] no sources");
  size_t s = 0;
  for (const auto& x : sources) s = std::max(s, x.size());
  const int64_t b = int64_t(sources.size());
  std::vector<int64_t> ids(size_t(b) * s, pad_token_id), mask(size_t(b) * s, 0);
  for (size_t i = 0; i < sources.size(); ++i) {
    std::copy(sources[i].begin(), sources[i].end(), ids.begin() + int64_t(i * s));
    std::fill_n(mask.begin() + int64_t(i * s), sources[i].size(), 1);
  }
  return {Array::from_vector(ids, Shape{b, int64_t(s)}), Array::from_vector(mask, Shape{b, int64_t(s)})};
}

GenerationResult generate_seq2seq(const Seq2SeqLm& lm, const std::vector<std::vector<int64_t>>& sources,
                                  const GenerationConfig& config) {
  autodiff::NoGradGuard no_grad;
  MT_CHECK(lm.encode && lm.decode, "[generate] the encoder-decoder has no encode/decode functions");
  MT_CHECK(!sources.empty(), "[generate] no sources");
  size_t longest = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    MT_CHECK(!sources[i].empty(), "[generate] source ", i, " is empty");
    for (int64_t t : sources[i])
      MT_CHECK(t >= 0 && t < lm.vocab_size, "[generate] source ", i, " has token ", t, " outside the vocabulary of ",
               lm.vocab_size);
    longest = std::max(longest, sources[i].size());
  }
  if (lm.max_source_positions > 0)
    MT_CHECK(int64_t(longest) <= lm.max_source_positions, "[generate] a source of ", longest,
             " tokens exceeds the model's maximum of ", lm.max_source_positions, " positions");
  auto [ids, mask] = right_pad(sources, lm.pad_token_id);
  return generate_from_encoded(lm, lm.encode(ids, mask), config);
}

GenerationResult generate_from_encoded(const Seq2SeqLm& lm, EncoderOutput encoded, const GenerationConfig& config) {
  autodiff::NoGradGuard no_grad;
  MT_CHECK(lm.decode, "[generate] the encoder-decoder has no decode function");
  MT_CHECK(encoded.batch() > 0, "[generate] nothing encoded");
  GenerationConfig c = config;
  if (!c.forced_bos_token_id) c.forced_bos_token_id = lm.forced_bos_token_id;
  if (!c.forced_eos_token_id) c.forced_eos_token_id = lm.forced_eos_token_id;
  check_generation_config(c, lm.vocab_size);
  std::vector<int64_t> stops = c.stop_tokens;
  if (stops.empty() && !c.ignore_model_stop_tokens) stops = {lm.eos_token_id};
  int64_t budget = c.max_new_tokens;
  if (lm.max_target_positions > 0) budget = std::min(budget, lm.max_target_positions - 1);  // the start token's position
  Seq2SeqState state(lm, std::move(encoded), c.use_cache);
  return run_search(state, c, stops, budget);
}

}  // namespace mt::models
