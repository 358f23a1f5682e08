#pragma once
// Random arrays from a counter-based key (see core/rng.h). Element i of every output is a
// pure function of (key, i) with i the row-major flat index, so a slice of a random array
// equals the same elements generated alone: sharded runs match the single-device run.
#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"

namespace mt {

// Uniform on [lo, hi) (f32 arithmetic; bf16/f16 outputs are rounded).
Array random_uniform(const RngKey& key, const Shape& shape, DType dtype = DType::f32, double lo = 0.0, double hi = 1.0);
Array random_normal(const RngKey& key, const Shape& shape, DType dtype = DType::f32, double mean = 0.0,
                    double std = 1.0);
// Bool array, each element true with probability p (uniform_at(key, i) < p).
Array bernoulli(const RngKey& key, const Shape& shape, double p);

// Inverted dropout: element i is kept (and scaled by 1 / (1 - rate)) when
// uniform_at(key, i) >= rate, else zeroed. train = false or rate = 0 returns x itself.
// The VJP regenerates the same mask from the key instead of storing it.
Array dropout(const Array& x, double rate, const RngKey& key, bool train = true);

}  // namespace mt
