#include "meshtrain/distributed/sharded_random.h"

#include "meshtrain/backend/random.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/random.h"

namespace mt::dist {

namespace {
template <class Fill>
Array make_block(const Shape& shape, const Sharding& sharding, DType dtype, const std::string& what, Fill&& fill) {
  MT_CHECK(is_floating(dtype), "[random] ", what, ": dtype must be floating, got ", dtype_name(dtype));
  sharding.validate(shape, what);
  MT_CHECK(sharding.spec.partial.empty(), "[random] ", what, ": a random array cannot be partial");
  Array local = Array::empty(sharding.local_shape(shape), dtype, Device::cpu());  // drawn on the host, as ops/random
  fill(local, kernels::StreamBlock{shape.dims(), sharding.local_offsets(shape)});
  return global_view(local.to(current_device()), sharding);
}
}  // namespace

Array random_normal(const RngKey& key, const Shape& shape, const Sharding& sharding, DType dtype, double mean,
                    double std, const std::string& what) {
  if (sharding.is_trivial()) return mt::random_normal(key, shape, dtype, mean, std);
  return make_block(shape, sharding, dtype, what,
                    [&](Array& local, const kernels::StreamBlock& b) { cpu::random_normal(key.host_resolved(), local, mean, std, b); });
}

Array random_uniform(const RngKey& key, const Shape& shape, const Sharding& sharding, DType dtype, double lo, double hi,
                     const std::string& what) {
  if (sharding.is_trivial()) return mt::random_uniform(key, shape, dtype, lo, hi);
  return make_block(shape, sharding, dtype, what,
                    [&](Array& local, const kernels::StreamBlock& b) { cpu::random_uniform(key.host_resolved(), local, lo, hi, b); });
}

}  // namespace mt::dist
