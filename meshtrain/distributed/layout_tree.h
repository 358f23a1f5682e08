#pragma once
// The layouts of a tree of arrays, kept beside the values (like a pytree of NamedSharding):
// what a checkpoint restore needs to lay each saved array out like the live one. Optimizer
// slots are made with zeros_like, so they carry their parameter's layout; reading it back
// from the live tree needs no guess from the slot's path.
#include <map>
#include <string>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/distributed/sharding.h"

namespace mt::dist {

using LayoutTree = std::map<std::string, PartitionSpec>;

// Every path of `tree` with its array's PartitionSpec (replicated for plain arrays).
LayoutTree layout_tree(const Params& tree);

}  // namespace mt::dist
