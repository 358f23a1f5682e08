#pragma once
// The BPE merge step shared by every BPE tokenizer: a table of merge rules (token pair ->
// rank and merged token) and the merge loop that applies them to one word's symbols,
// lowest rank first and leftmost on ties, as Hugging Face `tokenizers` does.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "meshtrain/tokenizers/vocab.h"

namespace mt::tokenizers {

struct BpeMerge {
  std::string left, right;
  size_t line = 0;  // where it came from, for error messages (0: unknown)
};

// One word's tokens: (token id, byte length in the text).
using BpeWord = std::vector<std::pair<int32_t, uint32_t>>;

class BpeMergeTable {
 public:
  BpeMergeTable() = default;
  // Each merge's tokens and their concatenation must be in `vocab`; errors name `source`
  // and the merge's line (or index).
  BpeMergeTable(const Vocab& vocab, const std::vector<BpeMerge>& merges, const std::string& source);
  size_t size() const { return merges_.size(); }
  // Merges `word` in place.
  void apply(BpeWord& word) const;

 private:
  struct PairHash {
    size_t operator()(uint64_t k) const noexcept { return size_t((k * 0x9E3779B97F4A7C15ull) >> 17); }
  };
  const std::pair<int32_t, int32_t>* find(int32_t a, int32_t b) const {
    auto it = merges_.find(uint64_t(uint32_t(a)) << 32 | uint32_t(b));
    return it == merges_.end() ? nullptr : &it->second;
  }
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>, PairHash> merges_;  // (a,b) -> (rank, merged id)
};

}  // namespace mt::tokenizers
