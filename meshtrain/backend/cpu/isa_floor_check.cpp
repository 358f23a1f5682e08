// meshtrain is built for x86-64-v3 (AVX2 + FMA + F16C). On an older CPU the first AVX2 instruction
// would kill the process with "Illegal instruction"; this check runs before any other
// initializer and says what is missing instead. This file alone is compiled for baseline
// x86-64 (CMakeLists.txt), so the check itself runs anywhere.
#include <cstdio>
#include <cstdlib>

namespace mt::cpu {

extern const int isa_floor_checked;
const int isa_floor_checked = 1;  // referenced by cpu_features.cpp so the linker keeps this file

namespace {

__attribute__((constructor(101))) void require_avx2_and_fma() {
  __builtin_cpu_init();
  // F16C: the f16 conversions (core/dtype.h) are its instructions.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return;
  std::fputs("meshtrain: this CPU lacks AVX2/FMA/F16C; meshtrain needs an x86-64-v3 CPU (AVX2 is the floor)\n", stderr);
  std::_Exit(1);
}

}  // namespace
}  // namespace mt::cpu
