#pragma once
// Learning-rate schedules: functions from the step (0-based count of updates already
// applied) to a value, composable like optax's.
#include <cstdint>
#include <functional>
#include <vector>

namespace mt::optim {

using Schedule = std::function<double(int64_t step)>;

Schedule constant_schedule(double value);
// init -> end linearly over `steps`, then end.
Schedule linear_schedule(double init, double end, int64_t steps);
// init · (alpha + (1 − alpha) · ½(1 + cos(π · step / steps))), then init · alpha.
Schedule cosine_decay_schedule(double init, int64_t steps, double alpha = 0.0);
// 0 -> peak over warmup steps, then cosine to end over the remaining decay_steps - warmup.
Schedule warmup_cosine_decay_schedule(double init, double peak, int64_t warmup, int64_t decay_steps, double end = 0.0);
// 0 -> peak over warmup, then linearly to end at total_steps (the HF run_glue schedule).
Schedule warmup_linear_decay_schedule(double peak, int64_t warmup, int64_t total_steps, double end = 0.0);
// schedules[i] from boundaries[i-1] on, each seeing steps counted from its boundary.
Schedule join_schedules(std::vector<Schedule> schedules, std::vector<int64_t> boundaries);

}  // namespace mt::optim
