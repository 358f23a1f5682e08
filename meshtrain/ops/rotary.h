#pragma once
#include "meshtrain/core/array.h"

namespace mt {

// Rotary position embedding on the last dim of x (..., T, D) with positions (T,) or
// (B, T) (B matching x's first dim, x being (B, H, T, D)). Half-split pairs (x_i,
// x_{i+D/2}) as Hugging Face LLaMA, or interleaved pairs (x_2i, x_2i+1) as llama2.c.
// heads_inner: x is (B, T, H, D) instead (attention_heads_inner's layout), the positions the
// same. The angles' cos and sin are formed with ops (f32, as Hugging Face forms them, then in
// x's dtype); the rotation is one fused pass each way (the rotary_embedding primitive) unless
// the composed reference is asked for (fused_layers() off) or x is distributed, with the
// composed form's values and rounding either way.
Array rotary_embedding(const Array& x, const Array& positions, double theta = 10000.0, bool interleaved = false,
                       bool heads_inner = false);

}  // namespace mt
