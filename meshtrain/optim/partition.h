#pragma once
// Different optimizers for different parameters (optax's multi_transform): each parameter
// goes to the first rule whose regex matches its whole path, and `freeze()` trains nothing —
// no updates, no optimizer state, and the Trainer computes no gradients for it. LoRA freezes
// the base model this way and trains only the adapters.
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/optim/transform.h"

namespace mt::optim {

struct PartitionRule {
  std::string pattern;  // std::regex over the whole parameter path
  Transform transform;
};

// Routes each parameter to the first matching rule's transform; state entries are prefixed
// "<rule index>.". A parameter no rule matches is an error naming it (at init), as is an
// invalid regex.
Transform partition(std::vector<PartitionRule> rules);
// Leaves parameters unchanged and allocates nothing for them.
Transform freeze();

}  // namespace mt::optim
