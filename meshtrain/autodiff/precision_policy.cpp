#include "meshtrain/autodiff/precision_policy.h"

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"

namespace mt {

namespace {
thread_local PrecisionPolicy current_policy;
}  // namespace

Params PrecisionPolicy::cast_for_compute(const Params& master) const {
  if (!casts_parameters()) return master;
  autodiff::NoGradGuard no_grad;
  Params out;
  for (const auto& [path, v] : master)
    out.set(path, is_floating(v.dtype()) && v.dtype() != compute_dtype ? cast(v, compute_dtype) : v);
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
