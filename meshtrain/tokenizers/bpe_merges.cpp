#include "meshtrain/tokenizers/bpe_merges.h"

#include <algorithm>
#include <functional>

#include "meshtrain/core/error.h"

namespace mt::tokenizers {

BpeMergeTable::BpeMergeTable(const Vocab& vocab, const std::vector<BpeMerge>& merges, const std::string& source) {
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    const std::string where = m.line ? detail::concat(" line ", m.line) : detail::concat(" merge #", rank);
    auto a = vocab.find(m.left), b = vocab.find(m.right), ab = vocab.find(m.left + m.right);
    MT_CHECK(a && b, "[tokenizer] ", source, where, ": merge '", m.left, " ", m.right,
             "' uses a token missing from the vocabulary");
    MT_CHECK(ab.has_value(), "[tokenizer] ", source, where, ": merged token '", m.left + m.right,
             "' is missing from the vocabulary");
    // A repeated pair takes its last rank, as HF's map of merges does.
    merges_.insert_or_assign(uint64_t(uint32_t(*a)) << 32 | uint32_t(*b), std::pair<int32_t, int32_t>{int32_t(rank), *ab});
  }
}

void BpeMergeTable::apply(BpeWord& word) const {
  if (word.size() < 2 || merges_.empty()) return;
  struct Sym {
    int32_t id, prev, next;
    uint32_t len;
  };
  thread_local std::vector<Sym> syms;
  syms.clear();
  for (size_t i = 0; i < word.size(); ++i)
    syms.push_back({word[i].first, int32_t(i) - 1, i + 1 < word.size() ? int32_t(i + 1) : -1, word[i].second});
  // Min-heap on (rank, position): the lowest-ranked pair merges first, leftmost on ties.
  struct Cand {
    int32_t rank, pos, new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Cand> heap;  // reused across calls: no allocation per word
  heap.clear();
  auto push = [&](Cand c) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), std::greater<Cand>{});
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i)
    if (auto m = find(syms[i].id, syms[i + 1].id)) push({m->first, int32_t(i), m->second});
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>{});
    const Cand top = heap.back();
    heap.pop_back();
    Sym& left = syms[size_t(top.pos)];
    if (left.len == 0 || left.next < 0) continue;
    Sym& right = syms[size_t(left.next)];
    auto m = find(left.id, right.id);
    if (!m || m->second != top.new_id) continue;  // stale: a neighbour merged meanwhile
    left.id = top.new_id;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) syms[size_t(left.next)].prev = top.pos;
    if (left.prev >= 0)
      if (auto p = find(syms[size_t(left.prev)].id, left.id)) push({p->first, left.prev, p->second});
    if (left.next >= 0)
      if (auto p = find(left.id, syms[size_t(left.next)].id)) push({p->first, top.pos, p->second});
  }
  word.clear();
  for (int32_t i = 0; i >= 0; i = syms[size_t(i)].next) word.emplace_back(syms[size_t(i)].id, syms[size_t(i)].len);
}

}  // namespace mt::tokenizers
