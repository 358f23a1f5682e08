#pragma once
// Random arrays created directly in their sharding: each rank generates only its block, with
// the values the single-device array has at those positions (counter-based RNG), so a
// sharded model starts from exactly the single-device initialization.
#include "meshtrain/core/rng.h"
#include "meshtrain/distributed/spmd.h"

namespace mt::dist {

Array random_normal(const RngKey& key, const Shape& shape, const Sharding& sharding, DType dtype = DType::f32,
                    double mean = 0.0, double std = 1.0, const std::string& what = "array");
Array random_uniform(const RngKey& key, const Shape& shape, const Sharding& sharding, DType dtype = DType::f32,
                     double lo = 0.0, double hi = 1.0, const std::string& what = "array");

}  // namespace mt::dist
