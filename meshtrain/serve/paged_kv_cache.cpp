#include "meshtrain/serve/paged_kv_cache.h"

#include "meshtrain/core/error.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::serve {

PagedKvCache::PagedKvCache(int64_t blocks, int64_t block_size) {
  MT_CHECK(blocks > 0 && block_size > 0, "[serve] a KV pool of ", blocks, " blocks of ", block_size, " positions");
  pool_.blocks = blocks, pool_.block_size = block_size;
  free_.reserve(size_t(blocks));
  for (int64_t b = blocks - 1; b >= 0; --b) free_.push_back(b);
}

PagedKvCache::Sequence& PagedKvCache::sequence(int64_t seq) {
  auto it = sequences_.find(seq);
  MT_CHECK(it != sequences_.end(), "[serve] no sequence ", seq, " in the KV cache");
  return it->second;
}

int64_t PagedKvCache::length(int64_t seq) const {
  auto it = sequences_.find(seq);
  MT_CHECK(it != sequences_.end(), "[serve] no sequence ", seq, " in the KV cache");
  return it->second.length;
}

void PagedKvCache::grow(Sequence& s, int64_t length) {
  const int64_t need = (length + pool_.block_size - 1) / pool_.block_size;
  // The engine admits sequences only while their reserved lengths fit the budget, and the
  // pool holds the budget plus one partly filled block per sequence: running out is a bug.
  MT_CHECK(need - int64_t(s.blocks.size()) <= int64_t(free_.size()), "[serve] the KV pool of ", pool_.blocks,
           " blocks is exhausted (", free_.size(), " free, ", need - int64_t(s.blocks.size()), " needed)");
  while (int64_t(s.blocks.size()) < need) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  s.length = length;
}

void PagedKvCache::add(int64_t seq, int64_t length, const std::function<void(const Sequence&)>& fill) {
  MT_CHECK(!sequences_.count(seq), "[serve] sequence ", seq, " is already in the KV cache");
  Sequence s;
  grow(s, length);
  try {
    fill(s);
  } catch (...) {
    give_back(s);
    throw;
  }
  sequences_.emplace(seq, std::move(s));
}

std::vector<int64_t> PagedKvCache::slots(const Sequence& s, int64_t count) const {
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) out[size_t(j)] = slot(s, j);
  return out;
}

void PagedKvCache::store(int64_t seq, const models::KvCache& prefilled, int64_t row, int64_t length) {
  const int64_t p = prefilled.length();
  if (length == 0) length = p;
  MT_CHECK(row >= 0 && row < prefilled.batch() && length > 0 && length <= p, "[serve] cannot store the last ", length,
           " positions of row ", row, " of a prefilled cache holding ",
           prefilled.keys.empty() ? std::string("nothing") : prefilled.keys[0].str());
  // Row `row`'s last `length` positions, (1, Hkv, length, D).
  const auto positions = [&](const Array& x) {
    const Array r = prefilled.batch() == 1 ? x : slice(x, 0, row, row + 1);
    return length == p ? r : slice(r, 2, p - length, p);
  };
  add(seq, length, [&](const Sequence& s) {
    const std::vector<int64_t> at = slots(s, length);
    for (size_t l = 0; l < prefilled.keys.size(); ++l)
      pool_.write(l, positions(prefilled.keys[l]), positions(prefilled.values[l]), at);
  });
}

void PagedKvCache::fork(int64_t from, int64_t to) {
  const Sequence& source = sequence(from);
  // Whole blocks, (n, Hkv, block_size, D) -> (1, Hkv, n · block_size, D), into the new blocks.
  const int64_t n = int64_t(source.blocks.size());
  Array which;
  const auto rows = [&](const Array& pool) {
    if (!which.defined()) which = Array::from_vector(source.blocks, Shape{n}).to(pool.device());
    return reshape(swap_axes(take(pool, which, 0), 0, 1), {1, pool.dim(1), n * pool_.block_size, pool.dim(3)});
  };
  add(to, source.length, [&](const Sequence& s) {
    const std::vector<int64_t> at = slots(s, n * pool_.block_size);
    for (size_t l = 0; l < pool_.keys.size(); ++l) pool_.write(l, rows(pool_.keys[l]), rows(pool_.values[l]), at);
  });
}

models::PagedKvStep PagedKvCache::step(const std::vector<int64_t>& seqs) {
  // Every block the step needs is checked for first: a step that cannot run changes nothing.
  int64_t needed = 0;
  for (int64_t id : seqs) needed += sequence(id).length % pool_.block_size == 0 ? 1 : 0;
  MT_CHECK(needed <= int64_t(free_.size()), "[serve] the KV pool of ", pool_.blocks, " blocks is exhausted (",
           free_.size(), " free, ", needed, " needed)");
  models::PagedKvStep step;
  step.pool = &pool_;
  std::vector<const Sequence*> rows;
  size_t widest = 0;
  for (int64_t id : seqs) {
    Sequence& s = sequence(id);
    grow(s, s.length + 1);
    step.slots.push_back(slot(s, s.length - 1));
    step.rows.lengths.push_back(s.length);
    widest = std::max(widest, s.blocks.size());
    rows.push_back(&s);
  }
  step.rows.max_blocks = int64_t(widest);
  step.rows.block_table.assign(seqs.size() * widest, 0);
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(rows[i]->blocks.begin(), rows[i]->blocks.end(),
              step.rows.block_table.begin() + std::ptrdiff_t(i * widest));
  return step;
}

void PagedKvCache::give_back(Sequence& s) {
  for (auto b = s.blocks.rbegin(); b != s.blocks.rend(); ++b) free_.push_back(*b);
  s.blocks.clear();
  s.length = 0;
}

void PagedKvCache::drop(int64_t seq) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return;
  give_back(it->second);
  sequences_.erase(it);
}

int64_t PagedKvCache::bytes_in_use() const {
  return (pool_.blocks - int64_t(free_.size())) * pool_.block_bytes();
}

int64_t PagedKvCache::positions_in_use() const {
  int64_t n = 0;
  for (const auto& [seq, s] : sequences_) n += s.length;
  return n;
}

}  // namespace mt::serve
