#include "meshtrain/autodiff/precision_policy.h"

#include <vector>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/autodiff/plain_groups.h"
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
  // The plain weights of each device and dtype go through one multi-tensor cast (a launch or
  // two on a GPU, where a cast each was one launch per parameter); the others (sharded, empty)
  // through cast, which keeps their layout.
  Params out = master;
  std::vector<TreeSlot<Array>> others;
  for (const auto& group : plain_groups<Params, Array>(out, others)) {
    if (group.dtype == compute_dtype) continue;
    std::vector<Array> xs;
    for (const auto& slot : group.slots) xs.push_back(*slot.array);
    std::vector<Array> casts = cast_multi(xs, compute_dtype);
    for (size_t j = 0; j < casts.size(); ++j) *group.slots[j].array = std::move(casts[j]);
  }
  for (const auto& slot : others) {
    Array& x = *slot.array;
    if (x.defined() && is_floating(x.dtype()) && x.dtype() != compute_dtype) x = cast(x, compute_dtype);
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

PrecisionPolicy precision_policy_from_name(const std::string& given, const char* what) {
  // PyTorch's and Hugging Face's spellings name the same policies.
  const std::string name = given == "fp32" || given == "float32" ? "f32"
                           : given == "fp16" || given == "float16" || given == "half" ? "f16"
                           : given == "bfloat16" ? "bf16"
                           : given;
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
  if (name == "f16") {
    p.compute_dtype = DType::f16;
    p.loss_scaling = true;
    return p;
  }
  throw Error(detail::concat("[", what, "] expected ", precision_policy_names(), ", got '", given, "'"));
}

const char* precision_policy_names() { return "f32, tf32, bf16, f16 or bf16-matmul"; }

const PrecisionPolicy& precision_policy() { return current_policy; }

PrecisionScope::PrecisionScope(PrecisionPolicy policy) : saved_(current_policy), matmul_(policy.matmul) {
  current_policy = std::move(policy);
}
PrecisionScope::~PrecisionScope() { current_policy = std::move(saved_); }

}  // namespace mt
