#pragma once
// Mixed precision as data (the role of jmp's Policy and Flax's dtype / param_dtype): which
// dtype the parameters are kept in (the master copy the optimizer updates), which dtype the
// model computes in, and how f32 matmuls multiply. Under `bf16`:
//   - the parameters and the optimizer state stay f32;
//   - once per step the parameters are cast to bf16 (cast_for_compute) and each micro-step
//     reads them through precast (compute_view), whose gradient accumulates into f32;
//   - so every activation is bf16 from the embedding to the logits, saved activations take half
//     the memory, and matmuls take and write bf16 with f32 accumulation;
//   - layer/RMS norm, softmax and attention compute their statistics in f32 on bf16 storage,
//     and the losses compute in f32 and return an f32 scalar.
// `f16` is the same policy in IEEE half, whose range (6e-8 to 65504) needs the loss scaled:
// the Trainer's default step scales it dynamically (optim/loss_scale.h).
// The precision named `bf16-matmul` keeps everything f32 and rounds only matmul operands.
#include <string>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/ops/matmul.h"

namespace mt {

struct PrecisionPolicy {
  std::string name = "f32";
  DType compute_dtype = DType::f32;  // parameters cast to it where used; activations in it
  MatmulPrecision matmul = MatmulPrecision::f32;  // how f32 matmuls multiply
  bool loss_scaling = false;  // gradients need the loss scaled (f16's narrow range)

  bool casts_parameters() const { return compute_dtype != DType::f32; }
  // The floating parameters cast to the compute dtype (outside any trace; integer and
  // already-cast arrays as they are). Without a cast to make, the parameters themselves.
  Params cast_for_compute(const Params& master) const;
  // What the loss function reads: each parameter of `master` as precast(master, compute) where
  // `compute` holds its cast, so gradients flow to the f32 master; others as they are.
  // `compute` comes by value: a caller that moves its casts in (the last micro-step) leaves
  // the tape the only holder, which frees each cast after its last use in the backward pass.
  Params compute_view(const Params& master, Params compute) const;
};

// "f32", "tf32" (GPU matmuls on TF32 tensor cores; f32 on a CPU), "bf16" (the policy above),
// "f16" (the same in half precision, with loss scaling), "bf16-matmul" (f32 throughout, matmul
// operands rounded to bf16). Anything else throws mt::Error naming the flag `what` and the
// choices.
PrecisionPolicy precision_policy_from_name(const std::string& name, const char* what = "precision");
// The names precision_policy_from_name accepts, for help texts: "f32, tf32, bf16, f16 or bf16-matmul".
const char* precision_policy_names();

// The calling thread's policy (f32 unless a PrecisionScope is active). The Trainer and the
// Predictor read it when they run a step.
const PrecisionPolicy& precision_policy();

// Sets the calling thread's policy (and its matmul precision) until the scope ends.
class PrecisionScope {
 public:
  explicit PrecisionScope(PrecisionPolicy policy);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  PrecisionPolicy saved_;
  MatmulPrecisionScope matmul_;
};

}  // namespace mt
