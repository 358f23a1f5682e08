#include "meshtrain/core/device_constants.h"

#include <deque>
#include <mutex>
#include <unordered_map>

#include "meshtrain/core/error.h"

namespace mt {

namespace {
struct Cache {
  std::mutex mutex;
  std::unordered_map<std::string, Array> arrays;
  std::deque<std::string> order;  // oldest first
  size_t bytes = 0;
};

Cache& cache() {
  static Cache* c = new Cache();  // leaked: arrays may be released after main returns
  return *c;
}
}  // namespace

Array device_constant(const std::string& key, Device device, const std::function<Array()>& make) {
  Cache& c = cache();
  const std::string full_key = device.str() + "|" + key;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.arrays.find(full_key);
    if (it != c.arrays.end()) return it->second;
  }
  // Made outside the lock: `make` may itself use constants.
  Array made = make();
  MT_CHECK(made.defined() && !made.sharded() && !made.traced(), "[device_constant] '", key,
           "': expected a plain, untraced array");
  if (made.device() != device) made = made.to(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  auto [it, inserted] = c.arrays.emplace(full_key, made);
  if (!inserted) return it->second;  // another thread made it first: everyone shares one
  c.order.push_back(full_key);
  c.bytes += made.nbytes();
  while (c.bytes > kDeviceConstantBytes && c.order.size() > 1) {
    auto old = c.arrays.find(c.order.front());
    c.bytes -= old->second.nbytes();
    c.arrays.erase(old);
    c.order.pop_front();
  }
  return made;
}

DeviceConstantStats device_constant_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return {c.arrays.size(), c.bytes};
}

}  // namespace mt
