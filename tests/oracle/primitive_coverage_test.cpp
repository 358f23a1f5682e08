// The registry-driven primitive harness (like ggml's test-backend-ops): one case per
// registered primitive, each checked against PyTorch (forward and every floating input's
// VJP) and, where differentiable, against central finite differences. A registered primitive
// without a case fails; so does a primitive that runs but is not registered. Distributed-only
// primitives name the multi-process test that covers them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"
#include "tests/support/primitive_cases.h"

namespace mt::testing {
namespace {


TEST(PrimitiveCoverage, EveryRegisteredPrimitiveAgainstTorch) {
  std::set<std::string> seen;
  prim::OpObserver previous = prim::set_op_observer([&](const prim::OpEvent& e) { seen.insert(e.primitive.name()); });
  std::map<std::string, int> cases;
  for (const PrimitiveCase& c : primitive_cases()) {
    ++cases[c.primitive];
    check_against_torch(c.primitive, c.fn, c.torch, c.inputs, c.tol, c.grads);
    if (!c.grads) continue;
    check_finite_differences(c.primitive, c.fn, c.inputs);
    // Second order: the VJP (itself recorded under a nested trace) against finite
    // differences of the first input's cotangent.
    if (is_floating(c.inputs[0].dtype()) && c.inputs[0].dtype() == DType::f32) {
      Array probe = c.fn(c.inputs);
      Array cot = random_normal(probe.shape(), 777, probe.dtype());
      OpFn first_grad = [&](const std::vector<Array>& in) { return vjp(c.fn, in, cot).second[0]; };
      check_finite_differences(c.primitive + " (second order)", first_grad, c.inputs);
    }
  }
  prim::set_op_observer(previous);

  std::set<std::string> registered;
  for (const auto& p : prim::registered_primitives()) {
    EXPECT_TRUE(registered.insert(p.name).second) << "primitive '" << p.name << "' registered twice";
    bool distributed_only = false;
    for (const auto& d : distributed_only_primitives())
      if (d.primitive == p.name) {
        distributed_only = true;
        std::cout << "  " << p.family << "/" << p.name << ": covered by " << d.covered_by << "\n";
      }
    EXPECT_TRUE(distributed_only || cases.count(p.name)) << "registered primitive '" << p.family << "/" << p.name
                                                        << "' has no case in primitive_coverage_test";
  }
  for (const auto& [name, n] : cases) EXPECT_TRUE(registered.count(name)) << "case for unregistered primitive " << name;
  for (const std::string& name : seen)
    EXPECT_TRUE(registered.count(name)) << "primitive '" << name << "' ran but is not registered (MT_REGISTER_PRIMITIVES)";
  std::cout << "  " << registered.size() << " registered primitives, " << cases.size() << " with torch cases, "
            << seen.size() << " observed running\n";
}

// Every case again with its f32 inputs in bf16 (ggml's test-backend-ops runs each case per
// type): the same torch code then computes in bf16 too, forward and VJPs, held to bf16's
// tolerance. The label names the variant ("matmul [bf16]"). Mixed precision runs every
// primitive of a model this way.
TEST(PrimitiveCoverage, EveryPrimitiveInBf16AgainstTorch) {
  int variants = 0;
  for (const PrimitiveCase& c : primitive_cases()) {
    const std::optional<std::vector<Array>> bf16 = bf16_inputs(c);
    if (!bf16) continue;
    const std::vector<Array>& inputs = *bf16;
    Tolerance tol = default_tolerance(DType::bf16);
    tol.atol = std::max(tol.atol, c.tol.atol), tol.rtol = std::max(tol.rtol, c.tol.rtol);
    tol.scaled_atol = std::max(tol.scaled_atol, c.tol.scaled_atol);
    // The optimizer's state and updates are f32 by design (the master copy): those primitives
    // refuse bf16 with an error naming themselves.
    if (f32_only_primitive(c.primitive)) {
      try {
        c.fn(inputs);
        ADD_FAILURE() << c.primitive << " ran on bf16 arrays; it should refuse them";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("[" + c.primitive + "]"), std::string::npos) << e.what();
        std::cout << "  " << c.primitive << " [bf16] refused: " << e.what() << "\n";
      }
      continue;
    }
    try {
      check_against_torch(c.primitive + " [bf16]", c.fn, c.torch, inputs, tol, c.grads);
      ++variants;
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.primitive << " [bf16]: " << e.what();
    }
  }
  std::cout << "  " << variants << " cases run in bf16\n";
}

// Every case again in f16 (mixed precision's `f16` policy runs every primitive of a model so).
// Debian's PyTorch has no f16 kernels on the CPU for most of these ops (softmax, matmul), so
// the reference is the same torch code in f32 on the same values: each f32 input is rounded
// to f16 first, and meshtrain's side casts it to f16, runs the primitive on f16 arrays (its
// VJP too) and widens the result. The difference is then f16's own rounding, held to f16's
// tolerance. The label names the variant ("matmul [f16]").
TEST(PrimitiveCoverage, EveryPrimitiveInF16AgainstTorchF32) {
  int variants = 0;
  for (const PrimitiveCase& c : primitive_cases()) {
    std::vector<Array> inputs = c.inputs;
    std::vector<bool> narrowed(inputs.size(), false);
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && inputs[i].dtype() == DType::f32) {
        inputs[i] = cast(cast(inputs[i], DType::f16), DType::f32);  // values f16 can hold
        narrowed[i] = true;
      }
    if (std::find(narrowed.begin(), narrowed.end(), true) == narrowed.end()) continue;
    const OpFn in_f16 = [&c, narrowed](const std::vector<Array>& xs) {
      std::vector<Array> h = xs;
      for (size_t i = 0; i < h.size(); ++i)
        if (narrowed[i]) h[i] = cast(h[i], DType::f16);
      const Array y = c.fn(h);
      return is_floating(y.dtype()) ? cast(y, DType::f32) : y;
    };
    if (f32_only_primitive(c.primitive)) {
      const std::string error = error_of([&] { in_f16(inputs); });
      EXPECT_NE(error.find("[" + c.primitive + "]"), std::string::npos) << c.primitive << " [f16]: " << error;
      continue;
    }
    Tolerance tol = default_tolerance(DType::f16);
    tol.atol = std::max(tol.atol, c.tol.atol), tol.rtol = std::max(tol.rtol, c.tol.rtol);
    tol.scaled_atol = std::max(tol.scaled_atol, c.tol.scaled_atol);
    try {
      check_against_torch(c.primitive + " [f16]", in_f16, c.torch, inputs, tol, c.grads);
      ++variants;
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.primitive << " [f16]: " << e.what();
    }
  }
  std::cout << "  " << variants << " cases run in f16\n";
  EXPECT_GT(variants, 50);
}

// The observer sees each kernel call with its primitive, shapes and cost.
TEST(PrimitiveCoverage, ObserverReportsKernelCallsWithCost) {
  std::vector<std::pair<std::string, double>> calls;
  prim::OpObserver previous = prim::set_op_observer([&](const prim::OpEvent& e) {
    calls.emplace_back(e.primitive.name(), e.primitive.cost(e.inputs, e.info).flops);
  });
  Array y = matmul(random_normal({2, 3, 4}, 1), random_normal({4, 5}, 2));
  prim::set_op_observer(previous);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].first, "matmul");
  EXPECT_EQ(calls[0].second, 2.0 * 2 * 3 * 5 * 4);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
}

}  // namespace
}  // namespace mt::testing
