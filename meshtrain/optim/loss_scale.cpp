#include "meshtrain/optim/loss_scale.h"

#include <cfloat>
#include <cmath>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/optim/transform.h"

namespace mt::optim {

namespace {
// The largest scale whose product with f16's largest value is still a finite f32: beyond it
// the scaled loss or the scaled gradients would overflow f32 itself, every step.
constexpr double kMaxScale = double(FLT_MAX) / 65504.0;
}  // namespace

void validate(const LossScaleOptions& o, const char* what) {
  MT_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0 && o.init_scale <= kMaxScale, "[", what,
           "] the scale must be a positive number up to ", kMaxScale, " (f32's largest over f16's), got ", o.init_scale);
  MT_CHECK(o.growth_factor > 1 && o.backoff_factor > 0 && o.backoff_factor < 1, "[", what,
           "] growth_factor must be > 1 and backoff_factor in (0, 1), got ", o.growth_factor, " and ",
           o.backoff_factor);
  MT_CHECK(o.growth_interval >= 1, "[", what, "] the growth interval must be >= 1 step, got ", o.growth_interval);
}

LossScaler::LossScaler(LossScaleOptions options) : options_(options), scale_(options.init_scale) {
  validate(options_);
}

bool LossScaler::unscale(Params& grads, double divisor) const {
  autodiff::NoGradGuard no_grad;
  scale_in_place(grads, Array::scalar(1.0 / (scale_ * divisor), DType::f32));
  // An inf or NaN anywhere makes the sum of squares inf or NaN (so does a norm beyond f32's
  // range, ~1.8e19, which no step survives either). global_norm sums over the mesh.
  return std::isfinite(global_norm(grads).item());
}

void LossScaler::update(bool finite) {
  if (!finite) {
    ++skipped_;
    growth_tracker_ = 0;
    if (options_.dynamic) scale_ *= options_.backoff_factor;
    return;
  }
  if (!options_.dynamic) return;
  if (++growth_tracker_ == options_.growth_interval) {
    growth_tracker_ = 0;
    if (scale_ * options_.growth_factor <= kMaxScale) scale_ *= options_.growth_factor;
  }
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_}, {"growth_tracker", growth_tracker_}, {"skipped_steps", skipped_}};
}

void LossScaler::load_state(const nlohmann::json& state) {
  MT_CHECK(state.is_object() && state.contains("scale") && state["scale"].is_number(),
           "[loss scale] a checkpoint's loss_scale needs a numeric 'scale', got ", state.dump());
  const double saved = state["scale"].get<double>();
  MT_CHECK(std::isfinite(saved) && saved > 0, "[loss scale] a checkpoint's scale must be positive, got ", saved);
  // A fixed scale is the run's own choice (--loss-scale N on a resume wins); a dynamic one
  // continues where the checkpoint left it.
  if (options_.dynamic) scale_ = saved;
  growth_tracker_ = state.value("growth_tracker", int64_t(0));
  skipped_ = state.value("skipped_steps", int64_t(0));
}

}  // namespace mt::optim
