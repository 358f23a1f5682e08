#include "meshtrain/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/core/error.h"

namespace mt::optim {

Schedule constant_schedule(double value) {
  return [value](int64_t) { return value; };
}

Schedule linear_schedule(double init, double end, int64_t steps) {
  MT_CHECK(steps > 0, "[schedule] linear schedule needs steps > 0, got ", steps);
  return [=](int64_t step) {
    double frac = std::clamp(double(step) / double(steps), 0.0, 1.0);
    return init + (end - init) * frac;
  };
}

Schedule cosine_decay_schedule(double init, int64_t steps, double alpha) {
  MT_CHECK(steps > 0, "[schedule] cosine decay needs steps > 0, got ", steps);
  return [=](int64_t step) {
    double frac = std::clamp(double(step) / double(steps), 0.0, 1.0);
    return init * (alpha + (1 - alpha) * 0.5 * (1 + std::cos(M_PI * frac)));
  };
}

Schedule join_schedules(std::vector<Schedule> schedules, std::vector<int64_t> boundaries) {
  MT_CHECK(!schedules.empty() && boundaries.size() + 1 == schedules.size(), "[schedule] join needs one boundary fewer than schedules, got ",
           schedules.size(), " schedules and ", boundaries.size(), " boundaries");
  return [=](int64_t step) {
    size_t i = 0;
    int64_t start = 0;
    while (i < boundaries.size() && step >= boundaries[i]) start = boundaries[i++];
    return schedules[i](step - start);
  };
}

Schedule warmup_cosine_decay_schedule(double init, double peak, int64_t warmup, int64_t decay_steps, double end) {
  MT_CHECK(warmup >= 0 && decay_steps > warmup, "[schedule] warmup_cosine_decay needs 0 <= warmup < decay_steps, got ",
           warmup, " and ", decay_steps);
  if (warmup == 0) return cosine_decay_schedule(peak, decay_steps, peak != 0 ? end / peak : 0.0);
  return join_schedules({linear_schedule(init, peak, warmup),
                         cosine_decay_schedule(peak, decay_steps - warmup, peak != 0 ? end / peak : 0.0)},
                        {warmup});
}

Schedule warmup_linear_decay_schedule(double peak, int64_t warmup, int64_t total_steps, double end) {
  MT_CHECK(warmup >= 0 && total_steps > warmup, "[schedule] warmup_linear_decay needs 0 <= warmup < total_steps, got ",
           warmup, " and ", total_steps);
  if (warmup == 0) return linear_schedule(peak, end, total_steps);
  return join_schedules({linear_schedule(0.0, peak, warmup), linear_schedule(peak, end, total_steps - warmup)}, {warmup});
}

}  // namespace mt::optim
