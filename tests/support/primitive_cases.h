#pragma once
// One case per registered primitive (inputs, a call, a PyTorch expression): shared by the
// registry-driven harnesses — against PyTorch (tests/oracle/primitive_coverage_test.cpp)
// and sharded against one device (tests/spmd/primitive_sharding_test.cpp).
#include <optional>
#include <string>
#include <vector>

#include "tests/support/op_check.h"

namespace mt::testing {

struct PrimitiveCase {
  std::string primitive;
  std::vector<Array> inputs;
  OpFn fn;
  std::string torch;  // x0, x1, ... are the inputs; sets `out`
  bool grads = true;  // compare VJPs with torch and with finite differences
  Tolerance tol{};
};

struct DistributedOnly {
  std::string primitive;
  std::string covered_by;
};

// Every case, in registry order (inputs are deterministic).
std::vector<PrimitiveCase> primitive_cases();
// The case's inputs with every f32 array cast to bf16 (its bf16 variant); nullopt when it has
// no f32 input.
std::optional<std::vector<Array>> bf16_inputs(const PrimitiveCase& c);
// Primitives that take f32 only by design (the AdamW state is the f32 master copy): they
// refuse bf16 arrays with an error naming themselves.
bool f32_only_primitive(const std::string& name);
// Registered primitives that only run on distributed arrays, with the test that covers them.
const std::vector<DistributedOnly>& distributed_only_primitives();

}  // namespace mt::testing
