#include "meshtrain/train/step_memory.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "meshtrain/core/allocator.h"
#include "meshtrain/core/device.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/train/memory_usage.h"

namespace mt::train {

namespace {
constexpr double kGb = 1e9;

// Bytes of this rank's blocks (the views of one flat buffer, as Adam's moments, add up to it).
double local_bytes(const Params& tree) {
  double total = 0;
  for (const auto& [path, a] : tree)
    if (a.defined()) total += double(dist::local_view(a).nbytes());
  return total;
}

Device device_of(const Params& params) {
  for (const auto& [path, a] : params)
    if (a.defined()) return dist::local_view(a).device();
  return Device::cpu();
}
}  // namespace

std::string StepMemory::describe() const {
  char line[320];
  std::snprintf(line, sizeof line,
                "weights %.3f GB + optimizer state %.3f GB + gradients %.3f GB + activations and temporaries %.3f GB "
                "= peak %.3f GB of %s arrays",
                weights_gb, optimizer_gb, gradients_gb, activations_gb(), peak_gb, on_gpu ? "GPU" : "host");
  std::string out = line;
  if (resident_gb > 0) {
    std::snprintf(line, sizeof line, " (about %.2f GB resident)", resident_gb);
    out += line;
  }
  return out;
}

StepMemory measure_step_memory(const Params& params, double trained_elements, const Params& optimizer_state,
                               const std::function<void()>& step) {
  StepMemory m;
  m.weights_gb = local_bytes(params) / kGb;
  m.optimizer_gb = local_bytes(optimizer_state) / kGb;
  m.gradients_gb = 4.0 * trained_elements / kGb;
  const Device device = device_of(params);
  m.on_gpu = device.is_cuda();
  if (m.on_gpu) {
    synchronize(device);
    const size_t before = cuda_runtime().memory_stats(device.index).bytes_in_use;
    cuda_runtime().reset_peak(device.index);
    step();
    synchronize(device);
    const size_t peak = cuda_runtime().memory_stats(device.index).peak_bytes_in_use;
    // The arrays held before the step are the state (and anything else alive), counted once.
    m.peak_gb = m.weights_gb + m.optimizer_gb + double(peak - std::min(peak, before)) / kGb;
    return m;
  }
  CachingAllocator& host = CachingAllocator::instance();
  const AllocatorStats before = host.stats();
  const double resident_before = resident_bytes();
  host.reset_peak();
  step();
  const AllocatorStats after = host.stats();
  const double grew = double(after.peak_bytes_in_use - std::min(after.peak_bytes_in_use, before.bytes_in_use));
  m.peak_gb = m.weights_gb + m.optimizer_gb + grew / kGb;
  // Pages the allocator already caches serve the step first; only the rest is new memory.
  m.resident_gb = (resident_before + std::max(0.0, grew - double(before.bytes_cached))) / kGb;
  return m;
}

StepMemory max_over_ranks(const StepMemory& m) {
  dist::Communicator& world = dist::world();
  if (world.size() == 1) return m;
  std::vector<float> v{float(m.weights_gb), float(m.optimizer_gb), float(m.gradients_gb), float(m.peak_gb),
                       float(m.resident_gb)};
  world.all_reduce(v.data(), int64_t(v.size()), DType::f32, dist::ReduceOp::max);
  StepMemory out = m;
  out.weights_gb = v[0], out.optimizer_gb = v[1], out.gradients_gb = v[2], out.peak_gb = v[3], out.resident_gb = v[4];
  return out;
}

}  // namespace mt::train
