#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt::layout {

// A mesh's named axes and their sizes, without its communicators: all a sharding rule
// needs to know about the mesh.
struct MeshShape {
  std::vector<std::string> names;
  std::vector<int> sizes;
  int axis_size(const std::string& axis) const;  // 1 for an axis the mesh does not have
  // Product of the sizes of `axes` (the number of blocks a dim split over them is cut into).
  int64_t blocks(const std::vector<std::string>& axes) const;
  bool operator==(const MeshShape& o) const { return names == o.names && sizes == o.sizes; }
};

}  // namespace mt::layout
