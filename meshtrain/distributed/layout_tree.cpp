#include "meshtrain/distributed/layout_tree.h"

#include "meshtrain/distributed/spmd.h"

namespace mt::dist {

LayoutTree layout_tree(const Params& tree) {
  LayoutTree out;
  for (const auto& [path, a] : tree) {
    const Sharding* s = sharding_of(a);
    out[path] = s ? s->spec : PartitionSpec{};
  }
  return out;
}

}  // namespace mt::dist
