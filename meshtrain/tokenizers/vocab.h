#pragma once
// A token <-> id table with string_view lookups (no allocation per query).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mt::tokenizers {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept {
    // FNV-1a: tokens are short, and this beats the general-purpose hash on them.
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return size_t(h ^ (h >> 29));
  }
};

class Vocab {
 public:
  // Returns false when the token is already present (the later id wins, as in HF).
  bool add(std::string token, int32_t id) {
    if (id >= int32_t(by_id_.size())) {
      by_id_.resize(size_t(id) + 1);
      present_.resize(size_t(id) + 1, false);
    }
    by_id_[size_t(id)] = token;
    present_[size_t(id)] = true;
    auto [it, inserted] = by_token_.insert_or_assign(std::move(token), id);
    return inserted;
  }
  std::optional<int32_t> find(std::string_view token) const {
    auto it = by_token_.find(token);
    if (it == by_token_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* token(int32_t id) const {
    if (id < 0 || size_t(id) >= by_id_.size() || !present_[size_t(id)]) return nullptr;
    return &by_id_[size_t(id)];
  }
  size_t size() const { return by_token_.size(); }
  size_t id_bound() const { return by_id_.size(); }
  const std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>& map() const { return by_token_; }

 private:
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> by_token_;
  std::vector<std::string> by_id_;
  std::vector<bool> present_;
};

}  // namespace mt::tokenizers
