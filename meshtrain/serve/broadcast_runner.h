#pragma once
// Tensor-parallel serving: every rank holds its shards of the weights and must run each model
// step together, because the sharded forward pass communicates. Rank 0's engine uses a
// BroadcastRunner, which sends each call (prefill, fork, decode, drop) to the other ranks
// before running it; they run follow_steps(), which receives and runs the same calls until
// the engine shuts down. Every rank keeps the same KV caches (of its heads), so the logits,
// gathered on every rank, are the ones one process computes.
#include <memory>

#include "meshtrain/serve/sequence_runner.h"

namespace mt::serve {

class BroadcastRunner : public SequenceRunner {
 public:
  BroadcastRunner(models::CausalLm lm, const KvCacheSize& size) : local_(std::move(lm), size) {}
  int64_t vocab_size() const override { return local_.vocab_size(); }
  int64_t kv_bytes_per_token() const override { return local_.kv_bytes_per_token(); }
  const models::CausalLm& model() const override { return local_.model(); }
  std::vector<float> prefill(const std::vector<int64_t>& seqs,
                             const std::vector<std::vector<int64_t>>& prompts) override;
  void fork(int64_t from, int64_t to) override;
  std::vector<float> decode(const std::vector<int64_t>& seqs, const std::vector<int64_t>& tokens) override;
  void drop(int64_t seq) override;
  int64_t cache_bytes() const override { return local_.cache_bytes(); }
  void shutdown() override;

 private:
  LocalRunner local_;
};

// The other ranks: runs rank 0's calls on `lm` (this rank's shards) until it shuts down; `size`
// as rank 0's runner's.
void follow_steps(models::CausalLm lm, const KvCacheSize& size);

}  // namespace mt::serve
