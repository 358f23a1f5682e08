#include "meshtrain/layout/mesh_shape.h"

namespace mt::layout {

int MeshShape::axis_size(const std::string& axis) const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == axis) return sizes[i];
  return 1;
}

int64_t MeshShape::blocks(const std::vector<std::string>& axes) const {
  int64_t n = 1;
  for (const std::string& a : axes) n *= axis_size(a);
  return n;
}

}  // namespace mt::layout
