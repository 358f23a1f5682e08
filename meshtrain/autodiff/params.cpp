#include "meshtrain/autodiff/params.h"

#include "meshtrain/core/error.h"

namespace mt {

Params::Params(std::initializer_list<Entry> entries) {
  for (const auto& [path, value] : entries) set(path, value);
}

void Params::set(const std::string& path, Array value) {
  auto it = index_.find(path);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(path, entries_.size());
  entries_.emplace_back(path, std::move(value));
}

const Array& Params::at(const std::string& path) const {
  auto it = index_.find(path);
  MT_CHECK(it != index_.end(), "[params] no parameter named '", path, "'");
  return entries_[it->second].second;
}

Array& Params::at(const std::string& path) {
  auto it = index_.find(path);
  MT_CHECK(it != index_.end(), "[params] no parameter named '", path, "'");
  return entries_[it->second].second;
}

void Params::erase(const std::string& path) {
  auto it = index_.find(path);
  if (it == index_.end()) return;
  entries_.erase(entries_.begin() + long(it->second));
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
}

std::vector<std::string> Params::paths() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) out.push_back(e.first);
  return out;
}

int64_t Params::total_elements() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += e.second.numel();
  return n;
}

Params Params::with_prefix(const std::string& prefix) const {
  Params out;
  for (const auto& [path, value] : entries_)
    if (path.compare(0, prefix.size(), prefix) == 0) out.set(path, value);
  return out;
}

Params Params::subtree(const std::string& prefix) const {
  Params out;
  std::string p = prefix + ".";
  for (const auto& [path, value] : entries_)
    if (path.compare(0, p.size(), p) == 0) out.set(path.substr(p.size()), value);
  return out;
}

}  // namespace mt
