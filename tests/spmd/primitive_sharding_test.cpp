// The registry-driven harness under sharding: every primitive's case
// (tests/support/primitive_cases.h) runs on inputs split over a mesh — each input along its
// first dim the mesh axis divides, on a 1-D mesh and, with 4 ranks, on each axis of a 2-D
// one — and the gathered output and input gradients must equal the one-device run. Run
// under mpirun with 1, 2 and 4 ranks.
#include <gtest/gtest.h>

#include <iostream>

#include "meshtrain/distributed/mesh.h"
#include "meshtrain/distributed/spmd.h"
#include "tests/support/primitive_cases.h"

namespace mt::testing {
namespace {

using dist::Mesh;
using dist::PartitionSpec;

// x split along its first dim `axis` divides; replicated when none does.
Array split_first_divisible(const Array& x, const Mesh& mesh, const std::string& axis, int& split_dims) {
  const int n = mesh.axis_size(axis);
  for (int d = 0; d < x.ndim(); ++d)
    if (n > 1 && x.dim(d) % n == 0) {
      PartitionSpec spec;
      spec.dims.assign(size_t(x.ndim()), {});
      spec.dims[size_t(d)] = {axis};
      ++split_dims;
      return dist::shard(x, mesh, spec, "input");
    }
  return x;
}

TEST(PrimitiveSharding, EveryPrimitiveEqualsOneDevice) {
  const int n = dist::world().size();
  std::vector<std::pair<Mesh, std::string>> layouts{{Mesh::from_string("model=" + std::to_string(n)), "model"}};
  if (n == 4) {
    Mesh grid = Mesh::from_string("data=2,model=2");
    layouts.push_back({grid, "data"});
    layouts.push_back({grid, "model"});
  }
  int split_inputs = 0, cases = 0;
  double worst = 0;
  std::string worst_label;
  for (const PrimitiveCase& c : primitive_cases()) {
    ++cases;
    Array probe = c.fn(c.inputs);
    const bool grads = c.grads && is_floating(probe.dtype());
    Array cot = grads ? random_normal(probe.shape(), 99, probe.dtype()) : Array();
    Array ref_out = probe;
    std::vector<Array> ref_grads;
    if (grads) std::tie(ref_out, ref_grads) = vjp(c.fn, c.inputs, cot);
    for (const auto& [mesh, axis] : layouts) {
      const std::string label = c.primitive + " on " + mesh.str() + " split over " + axis;
      std::vector<Array> sharded;
      for (const Array& x : c.inputs) sharded.push_back(split_first_divisible(x, mesh, axis, split_inputs));
      Array out;
      std::vector<Array> g;
      if (grads) std::tie(out, g) = vjp(c.fn, sharded, cot);
      else out = c.fn(sharded);
      double err = max_abs_diff(dist::to_host(out), ref_out);
      for (size_t i = 0; i < g.size(); ++i)
        if (is_floating(c.inputs[i].dtype())) err = std::max(err, max_abs_diff(dist::to_host(g[i]), ref_grads[i]));
      EXPECT_LE(err, 1e-5) << label;
      if (err > worst) worst = err, worst_label = label;
    }
  }
  if (dist::world().rank() == 0)
    std::cout << "  [max err] " << cases << " primitive cases, " << split_inputs << " split inputs over "
              << layouts.size() << " layout(s): " << worst << (worst_label.empty() ? "" : " (" + worst_label + ")")
              << "\n";
}

}  // namespace
}  // namespace mt::testing
