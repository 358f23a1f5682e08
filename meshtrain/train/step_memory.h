#pragma once
// One training step's memory on this rank, measured by running it (`--dry-run`): what the
// arrays held before it (weights, optimizer state), the gradients it makes, and the most the
// arrays held at once (the step's peak; activations and temporaries are the rest). The first
// step's peak is every later step's: the state is allocated up front and each step frees
// what it made. On the CPU the resident peak it implies is reported too: resident memory now
// (program, libraries, data, the allocator's cache) plus what the step needs beyond the cache.
#include <cstdint>
#include <functional>
#include <string>

#include "meshtrain/autodiff/params.h"

namespace mt::train {

struct StepMemory {
  bool on_gpu = false;        // the figures are the GPU's (else the host arrays')
  double weights_gb = 0;      // this rank's blocks of the parameters
  double optimizer_gb = 0;    // this rank's optimizer state
  double gradients_gb = 0;    // f32 gradients of the trained parameters
  double peak_gb = 0;         // the most the arrays held at once during the step
  double resident_gb = 0;     // CPU: the implied peak resident memory (0 on a GPU)
  double activations_gb() const { return peak_gb - weights_gb - optimizer_gb - gradients_gb; }
  // "weights 3.10 GB + optimizer state 6.19 GB + gradients 3.10 GB + activations and
  // temporaries 0.52 GB = peak 12.91 GB of arrays (about 13.5 GB resident)".
  std::string describe() const;
};

// Runs `step` and measures it; `trained_elements` is this rank's count of parameter elements
// that get gradients (a number, not the arrays: an extra handle would stop the step from
// updating them in place).
StepMemory measure_step_memory(const Params& params, double trained_elements, const Params& optimizer_state,
                               const std::function<void()>& step);
// Each figure's maximum over every process (a collective: every rank calls it).
StepMemory max_over_ranks(const StepMemory& m);

}  // namespace mt::train
