#include "meshtrain/models/param_table.h"

#include <cmath>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

const char* param_kind_name(ParamKind kind) {
  switch (kind) {
    case ParamKind::embedding: return "embedding";
    case ParamKind::attention_qkv: return "attention_qkv";
    case ParamKind::attention_out: return "attention_out";
    case ParamKind::mlp_in: return "mlp_in";
    case ParamKind::mlp_out: return "mlp_out";
    case ParamKind::lm_head: return "lm_head";
    case ParamKind::position_bias: return "position_bias";
    case ParamKind::input_projection: return "input_projection";
    case ParamKind::dense: return "dense";
    case ParamKind::norm: return "norm";
    case ParamKind::bias: return "bias";
    case ParamKind::lora_a: return "lora_a";
    case ParamKind::lora_b: return "lora_b";
    case ParamKind::other: return "other";
  }
  return "other";
}

ParamRole linear_role(ParamKind kind) { return {kind, 1, 0}; }
ParamRole conv1d_role(ParamKind kind) { return {kind, 0, 1}; }
ParamRole embedding_role() { return {ParamKind::embedding, 0, 1}; }
ParamRole vector_role(ParamKind kind) { return {kind, -1, -1}; }

uint64_t path_hash(const std::string& path) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : path) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

Params init_params(const std::vector<ParamDef>& defs, const RngKey& key, DType dtype) {
  Params p;
  for (const ParamDef& d : defs) {
    RngKey k = key.fold_in(path_hash(d.path));
    Array v;
    switch (d.init) {
      case InitKind::zeros: v = Array::zeros(d.shape, dtype); break;
      case InitKind::ones: v = Array::ones(d.shape, dtype); break;
      case InitKind::normal: v = random_normal(k, d.shape, dtype, 0.0, d.std); break;
      case InitKind::xavier_uniform: {
        // Glorot: U(-a, a) with a = sqrt(6 / (fan_in + fan_out)).
        MT_CHECK(d.shape.ndim() == 2, "[init] xavier_uniform needs a matrix, got ", d.shape.str(), " for ", d.path);
        double a = std::sqrt(6.0 / double(d.shape[0] + d.shape[1]));
        v = random_uniform(k, d.shape, dtype, -a, a);
        break;
      }
      case InitKind::kaiming_uniform: {
        MT_CHECK(d.shape.ndim() == 2, "[init] kaiming_uniform needs a matrix, got ", d.shape.str(), " for ", d.path);
        double a = 1.0 / std::sqrt(double(d.shape[1]));
        v = random_uniform(k, d.shape, dtype, -a, a);
        break;
      }
    }
    if (d.zero_row >= 0 && d.zero_row < d.shape[0]) {
      // Rebuild with the row zeroed (a host write: init is not traced).
      Array c = cast(v, DType::f32).to(Device::cpu()).clone();
      float* row = c.data<float>() + d.zero_row * d.shape[1];
      for (int64_t j = 0; j < d.shape[1]; ++j) row[j] = 0.0f;
      v = cast(c.to(v.device()), dtype);
    }
    p.set(d.path, v);
  }
  return p;
}

ParamRoles roles_of(const std::vector<ParamDef>& defs) {
  ParamRoles r;
  for (const ParamDef& d : defs) r[d.path] = d.role;
  return r;
}

void check_params(const std::vector<ParamDef>& defs, const Params& params, const char* model) {
  for (const ParamDef& d : defs) {
    MT_CHECK(params.contains(d.path), "[", model, "] missing parameter '", d.path, "' (expected shape ",
             d.shape.str(), ")");
    const Array& a = params[d.path];
    MT_CHECK(a.shape() == d.shape, "[", model, "] parameter '", d.path, "' has shape ", a.shape().str(),
             ", expected ", d.shape.str());
  }
}

}  // namespace mt::models
