#include "meshtrain/distributed/sharding.h"

#include <algorithm>
#include <set>

#include "meshtrain/core/error.h"

namespace mt::dist {

void Sharding::validate(const Shape& global, const std::string& what) const {
  MT_CHECK(spec.ndim() <= global.ndim(), "[sharding] ", what, ": spec ", spec.str(), " has ", spec.ndim(),
           " entries but the array has shape ", global.str());
  std::set<std::string> seen;
  for (const std::string& axis : spec.used_axes()) {
    if (!mesh.has_axis(axis)) {
      std::string names;
      for (const auto& n : mesh.axis_names()) names += (names.empty() ? "" : ", ") + n;
      throw Error(mt::detail::concat("[sharding] ", what, ": unknown mesh axis '", axis, "' in ", spec.str(),
                                 " (mesh ", mesh.str(), " has axes: ", names.empty() ? "none" : names, ")"));
    }
    MT_CHECK(seen.insert(axis).second, "[sharding] ", what, ": mesh axis '", axis, "' used twice in ", spec.str());
  }
  for (int d = 0; d < spec.ndim(); ++d) {
    int64_t blocks = num_blocks(d);
    MT_CHECK(global[d] % blocks == 0, "[sharding] ", what, ": dimension ", d, " of shape ", global.str(), " (size ",
             global[d], ") is not divisible by mesh axis ", spec.str(), " -> ", blocks, " shards");
  }
}

int64_t Sharding::num_blocks(int d) const {
  int64_t n = 1;
  for (const std::string& a : spec.axes_of(d)) n *= mesh.axis_size(a);
  return n;
}

int64_t Sharding::block_index(int d) const {
  int64_t idx = 0;
  for (const std::string& a : spec.axes_of(d)) idx = idx * mesh.axis_size(a) + mesh.axis_index(a);
  return idx;
}

Shape Sharding::local_shape(const Shape& global) const {
  std::vector<int64_t> dims = global.dims();
  for (int d = 0; d < spec.ndim() && d < global.ndim(); ++d) dims[size_t(d)] /= num_blocks(d);
  return Shape(dims);
}

std::vector<int64_t> Sharding::local_offsets(const Shape& global) const {
  std::vector<int64_t> off(size_t(global.ndim()), 0);
  for (int d = 0; d < spec.ndim() && d < global.ndim(); ++d)
    off[size_t(d)] = block_index(d) * (global[d] / num_blocks(d));
  return off;
}

}  // namespace mt::dist
