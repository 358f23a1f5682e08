#include "meshtrain/serve/sequence_runner.h"

#include "meshtrain/core/error.h"

namespace mt::serve {

namespace {
int64_t pool_blocks(const BatchDecoder& decoder, const KvCacheSize& size) {
  MT_CHECK(size.block_size > 0 && size.max_sequences > 0 && size.budget_bytes > 0, "[serve] a KV cache of ",
           size.budget_bytes, " bytes for ", size.max_sequences, " sequences in blocks of ", size.block_size);
  const int64_t block_bytes = decoder.kv_bytes_per_token() * size.block_size;
  return (size.budget_bytes + block_bytes - 1) / block_bytes + size.max_sequences;
}
}  // namespace

LocalRunner::LocalRunner(models::CausalLm lm, const KvCacheSize& size)
    : decoder_(std::move(lm)), cache_(pool_blocks(decoder_, size), size.block_size) {}

std::vector<float> LocalRunner::prefill(const std::vector<int64_t>& seqs,
                                        const std::vector<std::vector<int64_t>>& prompts) {
  MT_CHECK(seqs.size() == prompts.size(), "[serve] ", seqs.size(), " sequences for ", prompts.size(), " prompts");
  models::KvCache c;
  std::vector<float> logits = decoder_.prefill_batch(prompts, c);
  for (size_t i = 0; i < seqs.size(); ++i) {
    cache_.drop(seqs[i]);
    cache_.store(seqs[i], c, int64_t(i), int64_t(prompts[i].size()));
  }
  return logits;
}

void LocalRunner::fork(int64_t from, int64_t to) { cache_.fork(from, to); }

std::vector<float> LocalRunner::decode(const std::vector<int64_t>& seqs, const std::vector<int64_t>& tokens) {
  models::PagedKvStep step = cache_.step(seqs);
  return decoder_.decode(step, tokens);
}

}  // namespace mt::serve
