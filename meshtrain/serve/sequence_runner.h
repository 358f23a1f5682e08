#pragma once
// What the serving engine asks of the model: sequences known by id, each with its own KV
// cache (blocks of a paged one), prefilled and then decoded together. LocalRunner does it in this process; under
// tensor parallelism (broadcast_runner.h) rank 0's runner also sends every call to the other
// ranks, which run the same call on their shards of the weights.
#include <cstdint>
#include <vector>

#include "meshtrain/serve/batch_decoder.h"
#include "meshtrain/serve/paged_kv_cache.h"

namespace mt::serve {

class SequenceRunner {
 public:
  virtual ~SequenceRunner() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t kv_bytes_per_token() const = 0;
  virtual const models::CausalLm& model() const = 0;
  // Runs prompts[i] into a new cache for seqs[i], all in one forward pass; the next-token
  // logits, prompts × V.
  virtual std::vector<float> prefill(const std::vector<int64_t>& seqs,
                                     const std::vector<std::vector<int64_t>>& prompts) = 0;
  // `to` starts from `from`'s cache (the choices of one prompt share its prefill).
  virtual void fork(int64_t from, int64_t to) = 0;
  // One token for each of `seqs`; the next-token logits, seqs × V.
  virtual std::vector<float> decode(const std::vector<int64_t>& seqs, const std::vector<int64_t>& tokens) = 0;
  virtual void drop(int64_t seq) = 0;
  virtual int64_t cache_bytes() const = 0;  // the positions all sequences hold, in KV bytes
  // The engine's loop ends (followers stop following).
  virtual void shutdown() {}
};

// How much KV memory a runner keeps: room for `budget_bytes` of positions, plus one partly
// filled block for each of up to `max_sequences` sequences (a sequence's last block).
struct KvCacheSize {
  int64_t budget_bytes = int64_t(512) << 20;
  int64_t max_sequences = 16;
  int64_t block_size = 16;
};

class LocalRunner : public SequenceRunner {
 public:
  LocalRunner(models::CausalLm lm, const KvCacheSize& size);
  int64_t vocab_size() const override { return decoder_.vocab_size(); }
  int64_t kv_bytes_per_token() const override { return decoder_.kv_bytes_per_token(); }
  const models::CausalLm& model() const override { return decoder_.model(); }
  std::vector<float> prefill(const std::vector<int64_t>& seqs,
                             const std::vector<std::vector<int64_t>>& prompts) override;
  void fork(int64_t from, int64_t to) override;
  std::vector<float> decode(const std::vector<int64_t>& seqs, const std::vector<int64_t>& tokens) override;
  void drop(int64_t seq) override { cache_.drop(seq); }
  int64_t cache_bytes() const override { return cache_.positions_in_use() * decoder_.kv_bytes_per_token(); }

 private:
  BatchDecoder decoder_;
  PagedKvCache cache_;
};

}  // namespace mt::serve
