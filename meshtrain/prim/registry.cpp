#include "meshtrain/prim/registry.h"

#include <mutex>

namespace mt::prim {

namespace {
std::vector<RegisteredPrimitive>& registry() {
  static std::vector<RegisteredPrimitive> all;  // function-local: safe from static-init order
  return all;
}
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

bool register_primitives(const char* family, const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const std::string& n : names) registry().push_back({family, n});
  return true;
}

std::vector<RegisteredPrimitive> registered_primitives() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry();
}

}  // namespace mt::prim
