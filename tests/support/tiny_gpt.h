#pragma once
// A small pre-norm GPT with explicit layouts for every parallelism style, shared by the SPMD
// equivalence tests and the step-time benchmark (the models layer brings the real GPT-2).
#include <string>
#include <vector>

#include "meshtrain/distributed/mesh.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/models/param_roles.h"

namespace mt::testing {

struct TinyGptConfig {
  int64_t vocab = 64, width = 16, heads = 4, layers = 2, batch = 8, time = 8;
  double dropout = 0.1;
  DType dtype = DType::f32;
};

struct TinyGptParam {
  std::string path;
  Shape shape;
  double std;  // 0: a norm scale, initialized to ones
};

std::vector<TinyGptParam> tiny_gpt_params(const TinyGptConfig& c);

// Layouts: "single"/"dp" (replicated), "fsdp" (first dim over data), "tp" and "dp_tp"
// (Megatron: q/k/v/fc column-parallel, proj row-parallel, vocab-parallel embedding and head).
dist::PartitionSpec tiny_gpt_spec(const std::string& layout, const TinyGptParam& param);

// Declared roles of the weights (all stored [in, out]: x @ W) for the automatic rules.
models::ParamRoles tiny_gpt_roles(const TinyGptConfig& c);

// Initial parameters (identical values for every layout), each created in its sharding.
Params tiny_gpt_init(const TinyGptConfig& c, const std::string& layout, const dist::Mesh* mesh);

// Mean next-token cross-entropy; dropout keyed by `step`.
Array tiny_gpt_loss(const TinyGptConfig& c, const Params& p, const Array& ids, const Array& labels, uint64_t step);

// The library's AdamW with eps well above f32 noise in tiny gradients, whose sign Adam would
// otherwise amplify between runs that sum in different orders.
optim::Transform tiny_gpt_optimizer();

}  // namespace mt::testing
