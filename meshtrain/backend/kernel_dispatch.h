#pragma once
// A primitive has one kernel per backend, declared for both in its family's header
// (backend/<family>.h); MT_KERNEL picks the one for the device `array` lives on (the output, or
// the input the kernel reads): MT_KERNEL(out, unary, op, x, out) calls cuda::unary on a GPU
// array and cpu::unary otherwise. Both take the same arguments.
#include "meshtrain/core/array.h"

#define MT_KERNEL(array, fn, ...) \
  ((array).device().is_cuda() ? ::mt::cuda::fn(__VA_ARGS__) : ::mt::cpu::fn(__VA_ARGS__))
