#pragma once
// oneDNN matmul primitives ("plans"), one per product shape, cached so a repeated shape costs
// only an execute; internal to cpu/matmul.cpp.
//
// Creating a primitive JIT-compiles its kernels (~0.5 ms) and each one keeps ~95 KB (a bf16
// 768 × 768 product on AVX-512), so the cache is bounded: a server meeting every prompt length
// (each adds a product shape per layer kind) or a seq2seq run padding to each batch's longest
// rows would otherwise grow without end. Past the capacity (default 1024, or
// MT_MATMUL_PLAN_CACHE) the plan used least recently is dropped. Threads keep their own slots
// (memory objects rebound per call) for the shared plans it has run, and lets go of dropped
// plans at its next matmul, so the plans alive stay within the capacity plus what threads idle
// since the drop last ran.
#include "meshtrain/backend/matmul.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace mt::cpu::matmul_plans {

// Everything that changes the created primitive; `batch` is the batch the primitive runs.
struct PlanKey {
  kernels::MatmulDType dtype;
  int64_t batch, batch_a, batch_b, M, N, K;
  bool trans_a, trans_b, accumulate;
  bool operator==(const PlanKey&) const = default;
};

// "dtype=bf16 batch=1 ... accumulate=0", for error messages.
std::string describe(const PlanKey& key);

// Creates oneDNN's engine (after cpu_features() has applied any instruction-set cap, which
// oneDNN reads once) and the malloc settings its jit GEMM needs; idempotent.
void init_onednn();

// c = op(a) · op(b) (+ c when key.accumulate) on the cached primitive for `key`, creating it on
// first use. key.dtype is f32, bf16, f16 or bf16_f32 and runs natively here. Throws mt::Error
// starting with "[matmul]" if oneDNN cannot create or run it.
void run(const PlanKey& key, const void* a, const void* b, void* c);

size_t cached();                    // plans in the shared cache
size_t alive();                     // plans not yet destroyed (cached or held by a thread)
uint64_t created();                 // plans created since the process started
void clear();                       // drops every cached plan; safe while other threads run
size_t set_capacity(size_t plans);  // returns the previous capacity; plans >= 1

}  // namespace mt::cpu::matmul_plans
