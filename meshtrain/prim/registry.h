#pragma once
// The list of every primitive, by family. Each family's file registers its primitives' names
// (MT_REGISTER_PRIMITIVES); tests/oracle/primitive_coverage_test.cpp loops over this list and
// fails for a primitive without a test case, and for a primitive that runs but is not listed.
#include <string>
#include <vector>

namespace mt::prim {

struct RegisteredPrimitive {
  std::string family;
  std::string name;
};

// Adds `names` under `family`; returns true (so it can initialize a static).
bool register_primitives(const char* family, const std::vector<std::string>& names);
std::vector<RegisteredPrimitive> registered_primitives();

}  // namespace mt::prim

#define MT_PRIMITIVES_CONCAT2(a, b) a##b
#define MT_PRIMITIVES_CONCAT(a, b) MT_PRIMITIVES_CONCAT2(a, b)
// At namespace scope in the family's .cpp: MT_REGISTER_PRIMITIVES("shape", {"reshape", ...});
#define MT_REGISTER_PRIMITIVES(family, ...)                                              \
  [[maybe_unused]] static const bool MT_PRIMITIVES_CONCAT(mt_primitives_, __LINE__) = \
      ::mt::prim::register_primitives(family, __VA_ARGS__)
