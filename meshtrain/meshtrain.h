#pragma once
// Public entry point of meshtrain: include this one header, use namespace mt.
#include "meshtrain/autodiff/node.h"
#include "meshtrain/autodiff/params.h"
#include "meshtrain/autodiff/value_and_grad.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/core/array.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/core/shape.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"
