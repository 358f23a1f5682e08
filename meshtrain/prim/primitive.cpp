#include "meshtrain/prim/primitive.h"

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/prim/dispatch.h"

namespace mt::prim {

Array Saved::output_for_vjp() const {
  if (!autodiff::grad_enabled()) return output;
  return apply(primitive, inputs);
}

bool Primitive::differentiable(const std::vector<Array>&, const OutputInfo& out) const {
  return is_floating(out.dtype);
}

std::vector<Array> Primitive::vjp(const Saved&, const Array&) const {
  throw Error(detail::concat("[", name(), "] has no gradient"));
}

layout::RuleResult Primitive::sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape& mesh) const {
  return layout::rules::replicate_all(in, mesh);
}

Cost Primitive::cost(const std::vector<Array>& inputs, const OutputInfo& out) const {
  Cost c;
  c.flops = double(out.shape.numel());
  c.bytes = double(out.shape.numel()) * double(dtype_size(out.dtype));
  for (const Array& a : inputs)
    if (a.defined()) c.bytes += double(a.nbytes());
  return c;
}

}  // namespace mt::prim
