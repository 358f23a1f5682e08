#pragma once
// Iteration over an output shape with broadcast inputs: dimensions are coalesced where
// every operand is contiguous across them, so common cases become one flat loop.
#include <cstdint>
#include <vector>

#include "meshtrain/core/shape.h"

namespace mt::cpu {

struct BroadcastPlan {
  std::vector<int64_t> dims;                  // coalesced output dims
  std::vector<std::vector<int64_t>> strides;  // per operand, element strides (0 = broadcast)
  int64_t rows() const;                       // product of all dims but the last
  int64_t row_length() const { return dims.empty() ? 1 : dims.back(); }
  // Element offsets of each operand at the start of `row`.
  void row_offsets(int64_t row, int64_t* offsets) const;
};

BroadcastPlan make_broadcast_plan(const Shape& out, const std::vector<Shape>& inputs);

}  // namespace mt::cpu
