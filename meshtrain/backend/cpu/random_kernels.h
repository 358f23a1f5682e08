#pragma once
// Random array kernels over the counter-based Philox stream of a key: element i of an
// output is always stream element i (its row-major flat index), whatever the chunking.
#include <cstdint>

#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"

namespace mt::cpu {

// out[i] = lo + (hi - lo) * uniform_at(key, i).   out: any shape, floating dtype.
void random_uniform(const RngKey& key, Array& out, double lo, double hi);
// out[i] = mean + std * normal_at(key, i).        out: any shape, floating dtype.
void random_normal(const RngKey& key, Array& out, double mean, double std);
// out[i] = uniform_at(key, i) < p.                out: any shape, bool.
void bernoulli(const RngKey& key, Array& out, double p);
// out[i] = uniform_at(key, i) >= rate ? x[i] / (1 - rate) : 0.
// x: any shape, floating   out: x's shape and dtype.
void dropout(const Array& x, Array& out, const RngKey& key, double rate);

}  // namespace mt::cpu
