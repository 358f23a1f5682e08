#include "meshtrain/core/device_constants.h"

#include <iterator>
#include <list>
#include <mutex>
#include <unordered_map>

#include "meshtrain/core/device.h"
#include "meshtrain/core/error.h"

namespace mt {

namespace {
struct Cache {
  struct Entry {
    Array array;
    std::list<std::string>::iterator use;  // its place in `uses`
    // Read by a captured graph, which holds no handle to it and replays at its address for as
    // long as the graph lives: never evicted (the pool would give its memory to other arrays).
    bool captured = false;
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
      if (capturing_device_work()) it->second.captured = true;
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
  c.entries.emplace(full_key, Cache::Entry{made, std::prev(c.uses.end()), capturing_device_work()});
  c.bytes += made.nbytes();
  // The least recently used go first, but never the one just made nor one a captured graph reads.
  auto victim = c.uses.begin();
  while (c.bytes > kDeviceConstantBytes || c.entries.size() > kDeviceConstantEntries) {
    while (victim != c.uses.end() && (*victim == full_key || c.entries.at(*victim).captured)) ++victim;
    if (victim == c.uses.end()) break;
    auto old = c.entries.find(*victim);
    c.bytes -= old->second.array.nbytes();
    c.entries.erase(old);
    victim = c.uses.erase(victim);
  }
  return made;
}

DeviceConstantStats device_constant_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return {c.entries.size(), c.bytes};
}

}  // namespace mt
