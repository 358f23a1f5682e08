#pragma once
// The parameter table each model declares: every parameter's Hugging Face path, shape,
// initializer and sharding role, the initial values drawn from it, and the check that a
// loaded tree matches it.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/models/param_roles.h"

namespace mt::models {

// kaiming_uniform: torch's kaiming_uniform_(a = sqrt(5)) on a [out, in] matrix, i.e.
// U(-1/sqrt(in), 1/sqrt(in)) — nn.Linear's default and PEFT's init of LoRA's A.
enum class InitKind { normal, zeros, ones, xavier_uniform, kaiming_uniform };

// One parameter of a model: its Hugging Face path, shape, random init and sharding role.
struct ParamDef {
  std::string path;
  Shape shape;
  ParamRole role;
  InitKind init = InitKind::normal;
  double std = 0.02;             // for InitKind::normal
  int64_t zero_row = -1;         // an embedding's padding row, zeroed after init (HF padding_idx)
  // The shape in Hugging Face files when the model keeps the same row-major data in another
  // shape (GPT-2's c_attn [in, 3*out] kept as [in, 3, out] so q, k and v split over heads
  // separately); loading reshapes from it, save_pretrained back to it.
  std::optional<Shape> file_shape{};
};

// Linear [out, in], Conv1D [in, out], embedding [rows, features], 1-d vectors.
ParamRole linear_role(ParamKind kind);
ParamRole conv1d_role(ParamKind kind);
ParamRole embedding_role();
ParamRole vector_role(ParamKind kind);  // norm / bias

// Initial values for every def: parameter `path` draws from key.fold_in(hash(path)), so a
// parameter's initial value does not depend on which other parameters exist.
Params init_params(const std::vector<ParamDef>& defs, const RngKey& key, DType dtype = DType::f32);
ParamRoles roles_of(const std::vector<ParamDef>& defs);
// Throws mt::Error naming `model`, the path and both shapes when a parameter is missing or
// has another shape than its def.
void check_params(const std::vector<ParamDef>& defs, const Params& params, const char* model);
uint64_t path_hash(const std::string& path);  // FNV-1a, stable across runs and platforms

}  // namespace mt::models
