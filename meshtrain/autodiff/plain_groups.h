#pragma once
// A tree's plain arrays grouped by device and dtype, for the multi-tensor kernels: the
// optimizer's clipping and update passes (optim/transform.cpp) and mixed precision's weight
// casts (precision_policy.cpp) each take one group per call.
#include <algorithm>
#include <string>
#include <vector>

#include "meshtrain/core/array.h"
#include "meshtrain/core/device.h"

namespace mt {

// A tree's plain (no layout) floating arrays grouped by device and dtype, in the tree's
// order: each group goes through the multi-tensor kernels in one call. The slots are the
// tree's own, so a caller can move the arrays out and back; `others` gets the rest.
template <class Slot>
struct TreeSlot {
  const std::string* path;
  Slot* array;
};
template <class Slot>
struct PlainGroup {
  Device device;
  DType dtype;
  std::vector<TreeSlot<Slot>> slots;
};
template <class Tree, class Slot>
std::vector<PlainGroup<Slot>> plain_groups(Tree& tree, std::vector<TreeSlot<Slot>>& others) {
  std::vector<PlainGroup<Slot>> groups;
  for (auto& [path, x] : tree) {
    if (!x.defined() || x.sharded() || !is_floating(x.dtype()) || x.numel() == 0) {
      others.push_back({&path, &x});
      continue;
    }
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const PlainGroup<Slot>& g) { return g.device == x.device() && g.dtype == x.dtype(); });
    if (it == groups.end()) it = groups.insert(groups.end(), PlainGroup<Slot>{x.device(), x.dtype(), {}});
    it->slots.push_back({&path, &x});
  }
  return groups;
}

}  // namespace mt
