#pragma once
#include <string>
#include <vector>

namespace mt::layout {

// How an array is laid out over the named axes of a mesh: for each array dimension, the
// mesh axes splitting it (major first; empty = not split), and the axes over which each
// rank holds a partial sum of the value (the true value is the sum over those ranks).
// Axes not named anywhere replicate the array.
struct PartitionSpec {
  std::vector<std::vector<std::string>> dims;
  std::vector<std::string> partial;

  PartitionSpec() = default;
  // One entry per dim: "" (or "None") = not split, "data", or "data+model" for several axes.
  PartitionSpec(std::initializer_list<std::string> per_dim);
  // "data,None", "(data+fsdp),model", "" (replicated, any rank); partial with "|partial=model".
  static PartitionSpec parse(const std::string& text);
  static PartitionSpec replicated() { return {}; }

  int ndim() const { return int(dims.size()); }
  // Axes splitting dim d (empty when the spec is shorter: trailing dims are not split).
  const std::vector<std::string>& axes_of(int d) const;
  // The dim split by `axis`, or -1.
  int dim_of(const std::string& axis) const;
  bool is_partial(const std::string& axis) const;
  bool is_replicated() const;  // nothing split, nothing partial
  std::vector<std::string> used_axes() const;

  PartitionSpec with_partial(std::vector<std::string> axes) const;
  PartitionSpec without_partial() const;
  // The same layout with `axes` taken out of every dim's split (partial sums unchanged).
  PartitionSpec without_axes(const std::vector<std::string>& axes) const;
  // The same layout padded with unsplit dims to rank n (for comparisons).
  PartitionSpec padded(int n) const;

  std::string str() const;  // "P(data, None)" / "P(data+model, None | partial: model)"
  bool operator==(const PartitionSpec& o) const;
  bool operator!=(const PartitionSpec& o) const { return !(*this == o); }
};

}  // namespace mt::layout
