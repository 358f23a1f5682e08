#pragma once
// What the serving engine asks of the model: sequences known by id, each with its own KV
// cache, prefilled and then decoded together. LocalRunner does it in this process; under
// tensor parallelism (broadcast_runner.h) rank 0's runner also sends every call to the other
// ranks, which run the same call on their shards of the weights.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "meshtrain/serve/batch_decoder.h"

namespace mt::serve {

class SequenceRunner {
 public:
  virtual ~SequenceRunner() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t kv_bytes_per_token() const = 0;
  virtual const models::CausalLm& model() const = 0;
  // Runs `prompt` into a new cache for `seq`; the next-token logits (V,).
  virtual std::vector<float> prefill(int64_t seq, const std::vector<int64_t>& prompt) = 0;
  // `to` starts from `from`'s cache (the choices of one prompt share its prefill).
  virtual void fork(int64_t from, int64_t to) = 0;
  // One token for each of `seqs`; the next-token logits, seqs × V.
  virtual std::vector<float> decode(const std::vector<int64_t>& seqs, const std::vector<int64_t>& tokens) = 0;
  virtual void drop(int64_t seq) = 0;
  virtual int64_t cache_bytes() const = 0;  // all sequences' KV caches
  // The engine's loop ends (followers stop following).
  virtual void shutdown() {}
};

class LocalRunner : public SequenceRunner {
 public:
  explicit LocalRunner(models::CausalLm lm) : decoder_(std::move(lm)) {}
  int64_t vocab_size() const override { return decoder_.vocab_size(); }
  int64_t kv_bytes_per_token() const override { return decoder_.kv_bytes_per_token(); }
  const models::CausalLm& model() const override { return decoder_.model(); }
  std::vector<float> prefill(int64_t seq, const std::vector<int64_t>& prompt) override;
  void fork(int64_t from, int64_t to) override;
  std::vector<float> decode(const std::vector<int64_t>& seqs, const std::vector<int64_t>& tokens) override;
  void drop(int64_t seq) override { caches_.erase(seq); }
  int64_t cache_bytes() const override;

 private:
  models::KvCache& cache(int64_t seq);
  BatchDecoder decoder_;
  std::unordered_map<int64_t, models::KvCache> caches_;
};

}  // namespace mt::serve
