#include "meshtrain/autodiff/precision_policy.h"

#include <algorithm>
#include <string>
#include <vector>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/optimizer_ops.h"

namespace mt {

namespace {
thread_local PrecisionPolicy current_policy;
}  // namespace

Params PrecisionPolicy::cast_for_compute(const Params& master) const {
  if (!casts_parameters()) return master;
  autodiff::NoGradGuard no_grad;
  // Plain weights of one dtype on one device go through one multi-tensor cast per group (a
  // launch or two on a GPU, where a cast each was one launch per parameter); distributed ones
  // keep their layout through cast.
  struct Group {
    Device device;
    DType dtype;
    std::vector<std::string> paths;
  };
  std::vector<Group> groups;
  Params out;
  for (const auto& [path, v] : master) {
    const bool casts = is_floating(v.dtype()) && v.dtype() != compute_dtype;
    out.set(path, casts && v.distributed() ? cast(v, compute_dtype) : v);  // the plain ones replaced below
    if (!casts || v.distributed()) continue;
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const Group& x) { return x.device == v.device() && x.dtype == v.dtype(); });
    if (g == groups.end()) g = groups.insert(groups.end(), Group{v.device(), v.dtype(), {}});
    g->paths.push_back(path);
  }
  for (const Group& g : groups) {
    std::vector<Array> xs;
    for (const std::string& path : g.paths) xs.push_back(master[path]);
    std::vector<Array> casts = cast_multi(xs, compute_dtype);
    for (size_t j = 0; j < g.paths.size(); ++j) out.set(g.paths[j], std::move(casts[j]));
  }
  return out;
}

Params PrecisionPolicy::compute_view(const Params& master, Params compute) const {
  if (!casts_parameters()) return master;
  Params out;
  for (const auto& [path, v] : master) {
    const Array& c = compute.contains(path) ? compute[path] : v;
    out.set(path, c.dtype() == v.dtype() ? v : precast(v, c));
  }
  return out;
}

PrecisionPolicy precision_policy_from_name(const std::string& name, const char* what) {
  PrecisionPolicy p;
  p.name = name;
  if (name == "f32") return p;
  if (name == "tf32") {
    p.matmul = MatmulPrecision::tf32;
    return p;
  }
  if (name == "bf16") {
    p.compute_dtype = DType::bf16;
    return p;
  }
  if (name == "bf16-matmul") {
    p.matmul = MatmulPrecision::bf16;
    return p;
  }
  if (name == "f16")
    throw Error(detail::concat("[", what, "] f16 (with dynamic loss scaling) is not built; bf16 has f32's range and "
                               "needs no loss scaling: use bf16"));
  throw Error(detail::concat("[", what, "] expected ", precision_policy_names(), ", got '", name, "'"));
}

const char* precision_policy_names() { return "f32, tf32, bf16 or bf16-matmul"; }

const PrecisionPolicy& precision_policy() { return current_policy; }

PrecisionScope::PrecisionScope(PrecisionPolicy policy) : saved_(current_policy), matmul_(policy.matmul) {
  current_policy = std::move(policy);
}
PrecisionScope::~PrecisionScope() { current_policy = std::move(saved_); }

}  // namespace mt
