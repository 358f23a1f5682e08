#pragma once
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/core/layout.h"
#include "meshtrain/core/shape.h"
#include "meshtrain/distributed/mesh.h"
#include "meshtrain/layout/partition_spec.h"

namespace mt::dist {

// The layout vocabulary lives below the engine (rules are pure functions of it); the
// distributed layer binds it to a mesh.
using layout::PartitionSpec;

// A PartitionSpec bound to a mesh: everything needed to find this rank's block of a
// global array.
struct Sharding : Layout {
  Mesh mesh;
  PartitionSpec spec;

  Sharding() = default;
  Sharding(Mesh m, PartitionSpec s) : mesh(std::move(m)), spec(std::move(s)) {}

  // Throws mt::Error naming `what` (an array or parameter path), the dim and the axis when
  // the spec does not fit `global`: unknown axis, axis used twice, rank mismatch or a
  // dimension not divisible by its axes.
  void validate(const Shape& global, const std::string& what) const;
  // Number of blocks dim d is cut into (product of its axes' sizes).
  int64_t num_blocks(int d) const;
  // This rank's block index along dim d (its axes' coordinates, major first).
  int64_t block_index(int d) const;
  Shape local_shape(const Shape& global) const;
  std::vector<int64_t> local_offsets(const Shape& global) const;  // block start per dim
  // True when the array is stored whole on every rank with no partial sums.
  bool is_trivial() const override { return mesh.size() == 1 || spec.is_replicated(); }
  std::string str() const override { return spec.str() + " on " + mesh.str(); }
};

}  // namespace mt::dist
