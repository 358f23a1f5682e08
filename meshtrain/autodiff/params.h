#pragma once
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "meshtrain/core/array.h"

namespace mt {

// An ordered map from a parameter path ("bert.encoder.layer.0.attention.self.query.weight")
// to its Array; iteration follows insertion order, which fixes every traversal order
// (checkpoints, optimizer state, sharding plans).
class Params {
 public:
  using Entry = std::pair<std::string, Array>;
  Params() = default;
  Params(std::initializer_list<Entry> entries);

  // Inserts or replaces.
  void set(const std::string& path, Array value);
  bool contains(const std::string& path) const { return index_.count(path) > 0; }
  // Throws mt::Error naming the missing path.
  const Array& at(const std::string& path) const;
  Array& at(const std::string& path);
  const Array& operator[](const std::string& path) const { return at(path); }
  void erase(const std::string& path);

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }
  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }
  std::vector<std::string> paths() const;
  int64_t total_elements() const;

  // Params whose paths start with `prefix` (a string prefix, e.g. "h.3."), paths kept whole.
  Params with_prefix(const std::string& prefix) const;
  // Params whose paths start with `prefix.` with the prefix removed (a sub-module's tree).
  Params subtree(const std::string& prefix) const;

 private:
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace mt
