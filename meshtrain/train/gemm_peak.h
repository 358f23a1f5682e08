#pragma once
// The GEMM peak MFU is measured against: this machine's own mt::matmul rate for a dtype,
// probed once (about 0.4 s) and cached under $XDG_CACHE_HOME/meshtrain/gemm_peak.json
// (~/.cache when unset), keyed by CPU model, usable ISA, thread count and dtype.
#include <string>

#include "meshtrain/core/dtype.h"

namespace mt::train {

// GFLOP/s; `use_cache` false always probes (and refreshes the cache).
double gemm_peak_gflops(DType dtype, bool use_cache = true);
// The cache key of this machine for `dtype` ("<cpu model> | <isa> | <threads> threads | f32").
std::string gemm_peak_key(DType dtype);
std::string gemm_peak_cache_path();

}  // namespace mt::train
