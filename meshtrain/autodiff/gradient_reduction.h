#pragma once
// How value_and_grad brings each gradient to its parameter's layout. On one process there is
// nothing to do; the distributed layer installs an implementation (data-parallel partial
// sums reduced in buckets that overlap the backward pass, FSDP's reduce-scatter) when the
// first mesh is made, so autodiff never includes dist.
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/core/array.h"

namespace mt::autodiff {

class GradientReduction {
 public:
  virtual ~GradientReduction() = default;
  // Gradient `index` (of parameter `primal`) is final: start bringing it to the primal's
  // layout. Called during the backward pass.
  virtual void add(size_t index, const Array& grad, const Array& primal) = 0;
  // Waits for everything started; the gradients by index (undefined where add did nothing).
  virtual std::vector<Array> finish(size_t count) = 0;
  // The same change of layout, differentiable, for nested traces (no overlap).
  virtual Array to_layout_of(const Array& grad, const Array& primal) = 0;
};

using GradientReductionFactory = std::function<std::unique_ptr<GradientReduction>()>;
void install_gradient_reduction(GradientReductionFactory factory);
// A fresh reduction for one gradient computation, or null when none is installed.
std::unique_ptr<GradientReduction> make_gradient_reduction();

}  // namespace mt::autodiff
