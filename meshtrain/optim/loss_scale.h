#pragma once
// Dynamic loss scaling, for f16 compute (PyTorch's GradScaler, jmp's DynamicLossScale): f16
// tops out at 65504 and flushes below 6e-8, so small gradients of f16 activations would
// vanish. The loss is multiplied by `scale` before the backward pass, so every gradient is
// too; the f32 gradients are divided by it again before the optimizer. A step whose gradients
// are not all finite (the scale overflowed something) is skipped — parameters and optimizer
// state untouched — and the scale shrinks; after `growth_interval` finite steps in a row it
// grows again, so it hovers just below the largest scale that does not overflow.
#include <cstdint>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/params.h"

namespace mt::optim {

struct LossScaleOptions {
  double init_scale = 65536.0;  // 2^16, GradScaler's default
  bool dynamic = true;          // false: init_scale is kept for the whole run, steps are still skipped
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // finite steps in a row before the scale grows
};
// Throws mt::Error naming `what` for a scale or interval out of range.
void validate(const LossScaleOptions& o, const char* what = "loss scale");

class LossScaler {
 public:
  explicit LossScaler(LossScaleOptions options = {});

  double scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }  // finite steps since the last change
  int64_t skipped_steps() const { return skipped_; }

  // Divides every gradient by scale() × divisor in place (divisor: the micro-batches summed
  // into them) and returns whether all are finite, over every rank: the check is the global
  // norm of the sharded gradients, so all ranks agree on it. One read of a scalar to the host
  // (as GradScaler's step reads found_inf), which is why a loss-scaled step is not captured.
  bool unscale(Params& grads, double divisor) const;
  // After a step: shrink on overflow (and count the skip), else grow every growth_interval.
  void update(bool finite);

  // Saved in checkpoints, so a resumed run continues with the same scale (a fixed scale keeps
  // its own value; the counters are restored either way).
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  LossScaleOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace mt::optim
