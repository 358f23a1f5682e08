#pragma once
// What this CPU can do, decided once per process: the processor's own features (cpuid),
// the instruction-set cap a user or test may impose, and what oneDNN runs under that cap.
//
// AVX2 + FMA is the floor (the binaries are built for x86-64-v3). AVX-512, AVX512_BF16 and
// AMX are accelerations oneDNN picks at run time. Where oneDNN has no bf16 GEMM (below
// AVX-512), bf16 matmuls are widened to f32 (backend/cpu/matmul.cpp): same API,
// results within the bf16 tolerances, no speed-up.
//
// The cap: MESHTRAIN_MAX_CPU_ISA=avx2 (or avx512_core, avx512_core_bf16, avx512_core_amx,
// all) makes the engine behave as on a CPU with at most that ISA; oneDNN's own
// ONEDNN_MAX_CPU_ISA is honoured too, and the lower of the two wins. The tests use it to run
// the AVX2 path on an AVX-512 machine.
#include <string>

namespace mt::cpu {

struct CpuFeatures {
  // The processor (cpuid, with the OS saving the registers), whatever the cap.
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false, amx_tile = false, amx_bf16 = false;
  std::string cpu_isa;  // the best oneDNN ISA the processor has, e.g. "avx512_core_amx"

  std::string cap;         // the cap in force, lower-case ("" when none)
  std::string cap_source;  // "MESHTRAIN_MAX_CPU_ISA" or "ONEDNN_MAX_CPU_ISA"
  std::string isa;         // oneDNN's effective ISA under the cap, e.g. "avx2"

  bool bf16_gemm_onednn = false;  // oneDNN has a bf16 matmul under the cap (AVX-512 and up)
  // bf16 GEMMs (and the CPU attention's bf16 products) run on oneDNN's bf16 kernels; when
  // false they are widened to f32 and run on the f32 GEMM, except products too small to
  // repay the widening (cpu/matmul.cpp). Native where oneDNN has them, except on an
  // AVX512_BF16 core without AMX whose dot product measures below 0.75x the f32 FMA's flop
  // rate (an Intel Xeon: 0.48x). MESHTRAIN_CPU_BF16_GEMM=native|widened|auto chooses; each
  // process measures for itself (a rate far from the threshold on both known kinds).
  bool bf16_gemm_native = false;
  double bf16_dot_rate = 0;      // VDPBF16PS flops / f32 FMA flops, measured (0: not measured)
  std::string bf16_gemm_forced;  // "native" or "widened" when MESHTRAIN_CPU_BF16_GEMM chose
  bool f16_gemm_native = false;  // oneDNN multiplies f16 matrices (AVX512_FP16 / AMX-FP16)
};

// Detected on first use, before oneDNN creates any primitive (the cap must come first).
// Throws mt::Error naming the variable for a cap that is not an ISA name.
const CpuFeatures& cpu_features();

// One line for the start of every command, e.g. "cpu: avx2, bf16 emulated (widened to
// f32)" or "cpu: avx512_core_amx, bf16 native (AMX)"; names the cap when one is set.
std::string cpu_summary();

// How bf16 GEMMs run here, in a few words: "native (AMX)", "native (AVX512_BF16, ...)",
// "widened to f32 (AVX512_BF16's dot product under 0.75x the f32 FMA's rate here)",
// "by oneDNN on avx512_core (no AVX512_BF16)" or "emulated (widened to f32)".
std::string bf16_gemm_mode();

}  // namespace mt::cpu
