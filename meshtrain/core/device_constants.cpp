#include "meshtrain/core/device_constants.h"

#include <iterator>
#include <list>
#include <mutex>
#include <unordered_map>

#include "meshtrain/core/error.h"

namespace mt {

namespace {
struct Cache {
  struct Entry {
    Array array;
    std::list<std::string>::iterator use;  // its place in `uses`
  };
  std::mutex mutex;
  std::unordered_map<std::string, Entry> entries;
  std::list<std::string> uses;  // least recently used first
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
    auto it = c.entries.find(full_key);
    if (it != c.entries.end()) {
      c.uses.splice(c.uses.end(), c.uses, it->second.use);
      return it->second.array;
    }
  }
  // Made outside the lock: `make` may itself use constants.
  Array made = make();
  MT_CHECK(made.defined() && !made.sharded() && !made.traced(), "[device_constant] '", key,
           "': expected a plain, untraced array");
  if (made.device() != device) made = made.to(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.entries.find(full_key);
  if (it != c.entries.end()) return it->second.array;  // another thread made it first: one for all
  c.uses.push_back(full_key);
  c.entries.emplace(full_key, Cache::Entry{made, std::prev(c.uses.end())});
  c.bytes += made.nbytes();
  while ((c.bytes > kDeviceConstantBytes || c.entries.size() > kDeviceConstantEntries) && c.uses.size() > 1) {
    auto old = c.entries.find(c.uses.front());
    c.bytes -= old->second.array.nbytes();
    c.entries.erase(old);
    c.uses.pop_front();
  }
  return made;
}

DeviceConstantStats device_constant_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return {c.entries.size(), c.bytes};
}

}  // namespace mt
