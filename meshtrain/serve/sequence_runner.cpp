#include "meshtrain/serve/sequence_runner.h"

#include "meshtrain/core/error.h"

namespace mt::serve {

models::KvCache& LocalRunner::cache(int64_t seq) {
  auto it = caches_.find(seq);
  MT_CHECK(it != caches_.end(), "[serve] no sequence ", seq);
  return it->second;
}

std::vector<float> LocalRunner::prefill(int64_t seq, const std::vector<int64_t>& prompt) {
  models::KvCache c;
  std::vector<float> logits = decoder_.prefill(prompt, c);
  caches_[seq] = std::move(c);
  return logits;
}

void LocalRunner::fork(int64_t from, int64_t to) {
  models::KvCache copy = cache(from);  // shares the arrays until either appends
  caches_[to] = std::move(copy);
}

std::vector<float> LocalRunner::decode(const std::vector<int64_t>& seqs, const std::vector<int64_t>& tokens) {
  std::vector<models::KvCache*> rows;
  rows.reserve(seqs.size());
  for (int64_t s : seqs) rows.push_back(&cache(s));
  return decoder_.decode(rows, tokens);
}

int64_t LocalRunner::cache_bytes() const {
  int64_t n = 0;
  for (const auto& [seq, c] : caches_) n += c.nbytes();
  return n;
}

}  // namespace mt::serve
