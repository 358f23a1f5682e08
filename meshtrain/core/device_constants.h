#pragma once
// Small arrays a step builds from shapes alone (position ranges, T5's relative-position
// buckets, rotary frequencies), made once per device and kept. A step then uploads nothing
// but its batch, and a captured CUDA graph finds each one at the same address on every
// replay (an upload inside the capture would replay a copy from a host buffer long reused).
// The cache holds a handle to each, so no kernel ever writes over one in place.
#include <cstddef>
#include <functional>
#include <string>

#include "meshtrain/core/array.h"

namespace mt {

// The array `make` returns for `key` on `device`, made (and moved to `device`) on the first
// call and the same array after. `key` must name everything the values depend on. The cache
// keeps at most kDeviceConstantBytes in kDeviceConstantEntries; beyond that the least
// recently used go (their holders keep them alive), except those read while a capture records
// (capturing_device_work): a graph holds no handle to them and replays at their addresses. For shapes a run meets again (training
// steps, a prefill), not for what changes every call (one decoding position after another).
Array device_constant(const std::string& key, Device device, const std::function<Array()>& make);

constexpr size_t kDeviceConstantBytes = size_t(256) << 20;
constexpr size_t kDeviceConstantEntries = 512;

// Entries and bytes held now (for tests).
struct DeviceConstantStats {
  size_t entries = 0;
  size_t bytes = 0;
};
DeviceConstantStats device_constant_stats();

}  // namespace mt
