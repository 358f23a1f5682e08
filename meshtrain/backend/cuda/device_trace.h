#pragma once
// The GPU track of --profile (issues 44, 45): every kernel, copy and fill timed by the device
// through CUPTI's activity API, kernels of replayed CUDA graphs included (with their graph's
// id), on the host trace's time base. Host spans of an asynchronous GPU step only time the
// launches; these say what the device did and where it sat idle.
#include <string>
#include <vector>

#include "meshtrain/core/device.h"

namespace mt::cuda {

// "" once the activity records are enabled, else why not (CUPTI refused: another profiler
// such as nsys or ncu holds it, or the driver is too old). Called again while on, it restarts:
// only work begun from then on is kept. (The profiler switches it on before any step is
// captured and restarts it at its first step: CUPTI may not time the nodes of a graph that
// was instantiated while it was off.)
std::string start_device_trace();
// Synchronizes, flushes and disables the records; the spans since start, by start time.
std::vector<DeviceSpan> stop_device_trace();

}  // namespace mt::cuda
