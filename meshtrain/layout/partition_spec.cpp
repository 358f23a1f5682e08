#include "meshtrain/layout/partition_spec.h"

#include <algorithm>
#include <sstream>

#include "meshtrain/core/error.h"

namespace mt::layout {

namespace {
std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t()"), b = s.find_last_not_of(" \t()");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<std::string> split_axes(const std::string& entry) {
  std::string e = trim(entry);
  if (e.empty() || e == "None" || e == "_") return {};
  std::vector<std::string> axes;
  std::stringstream ss(e);
  std::string a;
  while (std::getline(ss, a, '+')) {
    a = trim(a);
    MT_CHECK(!a.empty(), "[partition_spec] empty axis name in '", entry, "'");
    axes.push_back(a);
  }
  return axes;
}
}  // namespace

PartitionSpec::PartitionSpec(std::initializer_list<std::string> per_dim) {
  for (const std::string& e : per_dim) dims.push_back(split_axes(e));
}

PartitionSpec PartitionSpec::parse(const std::string& text) {
  PartitionSpec spec;
  std::string layout = text, partial_part;
  size_t bar = text.find('|');
  if (bar != std::string::npos) {
    layout = text.substr(0, bar);
    partial_part = trim(text.substr(bar + 1));
    MT_CHECK(partial_part.rfind("partial=", 0) == 0, "[partition_spec] expected '|partial=axis' in '", text, "'");
    spec.partial = split_axes(partial_part.substr(8));
  }
  if (!trim(layout).empty()) {
    std::stringstream ss(layout);
    std::string entry;
    while (std::getline(ss, entry, ',')) spec.dims.push_back(split_axes(entry));
  }
  return spec;
}

const std::vector<std::string>& PartitionSpec::axes_of(int d) const {
  static const std::vector<std::string> none;
  return d < ndim() ? dims[size_t(d)] : none;
}

int PartitionSpec::dim_of(const std::string& axis) const {
  for (int d = 0; d < ndim(); ++d)
    if (std::find(dims[size_t(d)].begin(), dims[size_t(d)].end(), axis) != dims[size_t(d)].end()) return d;
  return -1;
}

bool PartitionSpec::is_partial(const std::string& axis) const {
  return std::find(partial.begin(), partial.end(), axis) != partial.end();
}

bool PartitionSpec::is_replicated() const {
  if (!partial.empty()) return false;
  for (const auto& d : dims)
    if (!d.empty()) return false;
  return true;
}

std::vector<std::string> PartitionSpec::used_axes() const {
  std::vector<std::string> out;
  for (const auto& d : dims) out.insert(out.end(), d.begin(), d.end());
  out.insert(out.end(), partial.begin(), partial.end());
  return out;
}

PartitionSpec PartitionSpec::with_partial(std::vector<std::string> axes) const {
  PartitionSpec s = *this;
  s.partial = std::move(axes);
  std::sort(s.partial.begin(), s.partial.end());
  s.partial.erase(std::unique(s.partial.begin(), s.partial.end()), s.partial.end());
  return s;
}

PartitionSpec PartitionSpec::without_partial() const { return with_partial({}); }

PartitionSpec PartitionSpec::without_axes(const std::vector<std::string>& axes) const {
  PartitionSpec s = *this;
  for (auto& d : s.dims)
    d.erase(std::remove_if(d.begin(), d.end(),
                           [&](const std::string& a) { return std::find(axes.begin(), axes.end(), a) != axes.end(); }),
            d.end());
  return s;
}

PartitionSpec PartitionSpec::padded(int n) const {
  PartitionSpec s = *this;
  while (s.ndim() < n) s.dims.emplace_back();
  while (s.ndim() > n && s.dims.back().empty()) s.dims.pop_back();
  return s;
}

std::string PartitionSpec::str() const {
  std::string s = "P(";
  for (int d = 0; d < ndim(); ++d) {
    if (d) s += ", ";
    if (dims[size_t(d)].empty()) s += "None";
    for (size_t i = 0; i < dims[size_t(d)].size(); ++i) s += (i ? "+" : "") + dims[size_t(d)][i];
  }
  if (!partial.empty()) {
    s += " | partial: ";
    for (size_t i = 0; i < partial.size(); ++i) s += (i ? "+" : "") + partial[i];
  }
  return s + ")";
}

bool PartitionSpec::operator==(const PartitionSpec& o) const {
  int n = std::max(ndim(), o.ndim());
  PartitionSpec a = padded(n), b = o.padded(n);
  auto pa = a.partial, pb = b.partial;
  std::sort(pa.begin(), pa.end());
  std::sort(pb.begin(), pb.end());
  return a.dims == b.dims && pa == pb;
}

}  // namespace mt::layout
