#pragma once
// The GEMM peak MFU is measured against: this machine's own mt::matmul rate for a dtype on the
// current device, probed once (about 0.4 s) and cached under
// $XDG_CACHE_HOME/meshtrain/gemm_peak.json (~/.cache when unset), keyed by CPU model, usable
// ISA, thread count and dtype — or, on a GPU, by the GPU, matmul precision and dtype.
#include <cstdint>
#include <string>

#include "meshtrain/core/dtype.h"

namespace mt::train {

// The best GFLOP/s of mt::matmul on n x n x n `dtype` arrays, after one warm-up call, over at
// most `max_runs` runs and `budget_s` seconds (the probe and bench/ both measure with it).
double measure_gemm_gflops(DType dtype, int64_t n, int max_runs, double budget_s);
// GFLOP/s; `use_cache` false always probes (and refreshes the cache).
double gemm_peak_gflops(DType dtype, bool use_cache = true);
// The cache key of this machine for `dtype` ("<cpu model> | <isa> | <threads> threads | f32";
// on a GPU "<gpu> | <matmul precision> | f32").
std::string gemm_peak_key(DType dtype);
std::string gemm_peak_cache_path();

}  // namespace mt::train
