#include "meshtrain/ops/random.h"

#include <cmath>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/cpu/random_kernels.h"
#include "meshtrain/core/error.h"
#include "meshtrain/dist/rules.h"
#include "meshtrain/dist/spmd.h"

namespace mt {

using Grads = std::vector<Array>;

namespace {
void check_shape(const Shape& shape, const char* op) {
  for (int64_t d : shape) MT_CHECK(d >= 0, "[", op, "] negative dimension in shape ", shape.str());
}
}  // namespace

Array random_uniform(const RngKey& key, const Shape& shape, DType dtype, double lo, double hi) {
  check_shape(shape, "random_uniform");
  MT_CHECK(is_floating(dtype), "[random_uniform] dtype must be floating, got ", dtype_name(dtype));
  MT_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "[random_uniform] need finite lo <= hi, got [", lo, ", ",
           hi, ")");
  Array out = Array::empty(shape, dtype);
  cpu::random_uniform(key, out, lo, hi);
  return out;
}

Array random_normal(const RngKey& key, const Shape& shape, DType dtype, double mean, double std) {
  check_shape(shape, "random_normal");
  MT_CHECK(is_floating(dtype), "[random_normal] dtype must be floating, got ", dtype_name(dtype));
  MT_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0,
           "[random_normal] need finite mean and std >= 0, got mean ", mean, " std ", std);
  Array out = Array::empty(shape, dtype);
  cpu::random_normal(key, out, mean, std);
  return out;
}

Array bernoulli(const RngKey& key, const Shape& shape, double p) {
  check_shape(shape, "bernoulli");
  MT_CHECK(p >= 0.0 && p <= 1.0, "[bernoulli] probability ", p, " outside [0, 1]");
  Array out = Array::empty(shape, DType::boolean);
  cpu::bernoulli(key, out, p);
  return out;
}

Array dropout(const Array& x, double rate, const RngKey& key, bool train) {
  MT_CHECK(x.defined(), "[dropout] undefined input array");
  MT_CHECK(is_floating(x.dtype()), "[dropout] expects a floating array, got ", x.str());
  MT_CHECK(rate >= 0.0 && rate <= 1.0, "[dropout] rate ", rate, " outside [0, 1] for ", x.str());
  if (!train || rate == 0.0) return x;
  if (dist::is_sharded(x)) {
    // Each rank masks its block with the stream elements of its global positions. The mask
    // depends only on position, so partial sums stay partial sums.
    const dist::Sharding& s = *dist::sharding_of(x);
    cpu::StreamBlock block{x.shape().dims(), s.local_offsets(x.shape())};
    return dist::spmd_call("dropout", {x}, dist::rules::gather_dims({}, true), [=](const std::vector<Array>& l) {
      Array out = Array::empty(l[0].shape(), l[0].dtype());
      cpu::dropout(l[0], out, key, rate, block);
      autodiff::record(out, "dropout", {l[0]}, [rate, key, block](const Array& g) {
        Array dg = Array::empty(g.shape(), g.dtype());
        cpu::dropout(g, dg, key, rate, block);
        return Grads{dg};
      });
      return out;
    });
  }
  Array out = Array::empty(x.shape(), x.dtype());
  cpu::dropout(x, out, key, rate);
  // Dropout is linear in x, so its VJP is itself with the same key (the same mask).
  autodiff::record(out, "dropout", {x}, [rate, key](const Array& g) { return Grads{dropout(g, rate, key, true)}; });
  return out;
}

}  // namespace mt
