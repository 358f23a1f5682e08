#pragma once
// JAX-style functional differentiation over Params:
//   auto [loss, grads] = mt::value_and_grad(loss_fn)(params, batch...);
//   auto [loss, aux, grads] = mt::value_and_grad(loss_fn, mt::has_aux)(params, batch...);
// Calls nest: grad of a function that itself calls grad gives exact second-order terms.
#include <tuple>
#include <type_traits>
#include <utility>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/error.h"

namespace mt {

struct HasAux {};
inline constexpr HasAux has_aux{};

template <class Aux>
struct ValueAuxGrads {
  Array value;
  Aux aux;
  Params grads;
};

namespace autodiff {

// Traced copies of every parameter (see make_leaf).
Params make_leaves(const Params& params);
// Gradient of scalar `value` with respect to every leaf; zeros where unreachable.
Params gradients(const Array& value, const Params& leaves, const Params& primals);
// The value with partial sums reduced (a loss over a sharded batch), for the caller.
Array resolve_value(const Array& value);
// Drops autodiff history from outputs returned to the caller of the outermost trace.
void detach_outputs(Array& a);
void detach_outputs(Params& p);
void detach_outputs(std::vector<Array>& v);
template <class T>
void detach_outputs(T&) {}  // other aux types carry no arrays we know of
template <class A, class B>
void detach_outputs(std::pair<A, B>& p) {
  detach_outputs(p.first);
  detach_outputs(p.second);
}

}  // namespace autodiff

template <class F>
auto value_and_grad(F f) {
  return [f](const Params& params, auto&&... args) -> std::pair<Array, Params> {
    autodiff::TraceScope scope;
    autodiff::EnableGradGuard grad_on;
    Params leaves = autodiff::make_leaves(params);
    Array value = f(leaves, std::forward<decltype(args)>(args)...);
    Params grads = autodiff::gradients(value, leaves, params);
    value = autodiff::resolve_value(value);
    if (autodiff::trace_depth() == 1) autodiff::detach_outputs(value);
    return {value, std::move(grads)};
  };
}

template <class F>
auto value_and_grad(F f, HasAux) {
  return [f](const Params& params, auto&&... args) {
    autodiff::TraceScope scope;
    autodiff::EnableGradGuard grad_on;
    Params leaves = autodiff::make_leaves(params);
    auto [value, aux] = f(leaves, std::forward<decltype(args)>(args)...);
    using Aux = std::decay_t<decltype(aux)>;
    Params grads = autodiff::gradients(value, leaves, params);
    ValueAuxGrads<Aux> out{autodiff::resolve_value(value), std::move(aux), std::move(grads)};
    if (autodiff::trace_depth() == 1) {
      autodiff::detach_outputs(out.value);
      autodiff::detach_outputs(out.aux);
    }
    return out;
  };
}

template <class F>
auto grad(F f) {
  return [f](const Params& params, auto&&... args) -> Params {
    return value_and_grad(f)(params, std::forward<decltype(args)>(args)...).second;
  };
}

// Identity in the forward pass; no gradient flows back through it.
Array stop_gradient(const Array& x);

// Vector-Jacobian product of f at `primals`: returns (f(primals), cotangents per primal).
std::pair<Array, std::vector<Array>> vjp(const std::function<Array(const std::vector<Array>&)>& f,
                                         const std::vector<Array>& primals, const Array& cotangent);

}  // namespace mt
