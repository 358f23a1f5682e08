#pragma once
// The conversions every part of the _meshtrain extension shares: parameter maps both ways,
// random keys from Python, and Python callables held by engine closures.
#include <pybind11/pybind11.h>

#include <map>
#include <memory>
#include <string>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/array.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"

namespace mt::python {

// {path: Array} from Python (pybind11 converts a dict of arrays to this map) -> Params.
inline Params params_of(const std::map<std::string, Array>& d) {
  Params p;
  for (const auto& [k, v] : d) p.set(k, v);
  return p;
}

// Params -> a Python dict in the Params' order. Needs the GIL.
inline pybind11::dict dict_of(const Params& p) {
  pybind11::dict d;
  for (const auto& [k, v] : p) d[pybind11::str(k)] = v;
  return d;
}

// A key from Python: an int seed, a (seed, stream) pair (meshtrain.random.key), or inside a
// Trainer's loss (seed, stream, step): the step is folded in last, after every fold_in, as the
// C++ step key folds it (RngKey::fold_last), so a Python loss draws the C++ loss's masks. None
// is the default key.
inline RngKey key_of(const pybind11::object& key) {
  if (key.is_none()) return RngKey{};
  if (pybind11::isinstance<pybind11::tuple>(key) || pybind11::isinstance<pybind11::list>(key)) {
    auto v = key.cast<std::vector<uint64_t>>();
    if (v.size() == 2) return RngKey{v[0], v[1]};
    // Made where the kernels run (a fill: nothing is uploaded).
    if (v.size() == 3) return RngKey{v[0], v[1]}.folding_last(Array::scalar(double(int64_t(v[2])), DType::i64, current_device()));
  }
  if (pybind11::isinstance<pybind11::int_>(key)) return RngKey{key.cast<uint64_t>(), 0};
  throw Error("[random] a key is an int seed, a (seed, stream) pair from meshtrain.random.key, or a Trainer's (seed, stream, step)");
}

// A key for Python: (seed, stream), and its last fold's value third when it has one (read to
// the host: a wait for the device on a GPU).
inline pybind11::tuple key_tuple(const RngKey& k) {
  if (!k.fold_last) return pybind11::make_tuple(k.seed, k.stream);
  const Array& last = *k.fold_last;
  const int64_t value = last.device().is_cpu() ? *last.data<int64_t>() : last.to_ints().at(0);
  return pybind11::make_tuple(k.seed, k.stream, uint64_t(value));
}

// A Python callable an engine closure keeps: released under the GIL, on whatever thread the
// closure dies.
inline std::shared_ptr<pybind11::function> held(const pybind11::function& fn) {
  return std::shared_ptr<pybind11::function>(new pybind11::function(fn), [](pybind11::function* p) {
    pybind11::gil_scoped_acquire gil;
    delete p;
  });
}

}  // namespace mt::python
