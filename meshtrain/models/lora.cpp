#include "meshtrain/models/lora.h"

#include <algorithm>
#include <regex>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

namespace {

const std::string kA = ".lora_A.weight", kB = ".lora_B.weight";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_dense_kind(ParamKind k) {
  switch (k) {
    case ParamKind::attention_qkv:
    case ParamKind::attention_out:
    case ParamKind::mlp_in:
    case ParamKind::mlp_out:
    case ParamKind::lm_head:
    case ParamKind::input_projection:
    case ParamKind::dense: return true;
    default: return false;
  }
}

// B's shape: the weight's dims without the input dim (c_attn: [3, out]), then r.
Shape b_shape(const LoraModule& m, int64_t rank) {
  std::vector<int64_t> dims;
  for (int d = 0; d < m.weight_shape.ndim(); ++d)
    if (d != m.role.in_dim) dims.push_back(m.weight_shape[d]);
  dims.push_back(rank);
  return Shape(dims);
}

}  // namespace

std::string lora_a_path(const std::string& module) { return module + kA; }
std::string lora_b_path(const std::string& module) { return module + kB; }
bool is_lora_path(const std::string& path) { return ends_with(path, kA) || ends_with(path, kB); }

std::string lora_base_weight_path(const std::string& adapter_path) {
  MT_CHECK(is_lora_path(adapter_path), "[lora] '", adapter_path, "' is not an adapter path");
  return adapter_path.substr(0, adapter_path.size() - kA.size()) + ".weight";
}

std::vector<LoraModule> lora_candidates(const std::vector<ParamDef>& base_defs) {
  std::vector<LoraModule> out;
  for (const ParamDef& d : base_defs) {
    if (!ends_with(d.path, ".weight") || !is_dense_kind(d.role.kind) || d.role.in_dim < 0) continue;
    if (d.shape.ndim() < 2) continue;
    LoraModule m{d.path.substr(0, d.path.size() - 7), d.shape, d.role, d.shape[d.role.in_dim], 0};
    m.out = d.shape.numel() / m.in;
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<LoraModule> lora_targets(const std::vector<ParamDef>& base_defs, const LoraOptions& options,
                                     const std::string& default_targets) {
  const std::string pattern = options.targets.empty() ? default_targets : options.targets;
  MT_CHECK(!pattern.empty(), "[lora] no target regex: pass --lora-targets (this model has no default targets)");
  std::regex re;
  try {
    re = std::regex(pattern);
  } catch (const std::regex_error& e) {
    throw Error("[lora] invalid target regex '" + pattern + "': " + e.what());
  }
  const std::vector<LoraModule> all = lora_candidates(base_defs);
  std::vector<LoraModule> picked;
  for (const LoraModule& m : all)
    if (std::regex_search(m.path, re)) picked.push_back(m);
  if (picked.empty()) {
    std::string some;
    for (size_t i = 0; i < all.size() && i < 8; ++i) some += (i ? ", " : "") + all[i].path;
    if (all.size() > 8) some += ", ...";
    throw Error("[lora] target regex '" + pattern + "' matches no dense layer; the model's dense layers are: " + some);
  }
  MT_CHECK(options.rank > 0, "[lora] rank must be > 0, got ", options.rank);
  MT_CHECK(options.alpha > 0, "[lora] alpha must be > 0, got ", options.alpha);
  MT_CHECK(options.dropout >= 0 && options.dropout < 1, "[lora] dropout must be in [0, 1), got ", options.dropout);
  for (const LoraModule& m : picked) {
    const int64_t out_per_group = m.weight_shape[m.role.out_dim >= 0 ? m.role.out_dim : 0];
    const int64_t limit = std::min(m.in, out_per_group);
    MT_CHECK(options.rank <= limit, "[lora] rank ", options.rank, " exceeds the smaller dimension (", limit, ") of ",
             m.path, ".weight ", m.weight_shape.str());
  }
  return picked;
}

std::vector<ParamDef> lora_param_defs(const std::vector<ParamDef>& base_defs, const LoraOptions& options,
                                      const std::string& default_targets) {
  std::vector<ParamDef> defs;
  for (const LoraModule& m : lora_targets(base_defs, options, default_targets)) {
    defs.push_back({lora_a_path(m.path), Shape{options.rank, m.in}, ParamRole{ParamKind::lora_a, 1, -1},
                    InitKind::kaiming_uniform});
    const Shape bs = b_shape(m, options.rank);
    // B's output dim: where the weight's output dim lands once its input dim is dropped.
    const int out_dim = m.role.out_dim - (m.role.out_dim > m.role.in_dim ? 1 : 0);
    defs.push_back({lora_b_path(m.path), bs, ParamRole{ParamKind::lora_b, -1, out_dim}, InitKind::zeros});
    if (bs.ndim() > 2) defs.back().file_shape = Shape{m.out, options.rank};
  }
  return defs;
}

Array lora_down(const Array& x, const Params& p, const std::string& module, const AdapterContext& ctx) {
  const std::string a = lora_a_path(module);
  if (!ctx.lora.enabled() || !p.contains(a)) return Array();
  Array in = ctx.lora.dropout > 0 ? dropout(x, ctx.lora.dropout, ctx.dropout_key.fold_in(path_hash(module)), ctx.train)
                                   : x;
  return linear(in, p[a]);
}

Array lora_up(const Array& down, const Array& b, const AdapterContext& ctx) {
  return mul(linear(down, b), ctx.lora.scale());
}

Array adapted_linear(const Array& x, const Params& p, const std::string& module, const Array& bias,
                     const AdapterContext& ctx) {
  Array y = linear(x, p[module + ".weight"], bias);
  Array down = lora_down(x, p, module, ctx);
  return down.defined() ? add(y, lora_up(down, p[lora_b_path(module)], ctx)) : y;
}

Array adapted_conv1d(const Array& x, const Params& p, const std::string& module, const Array& bias,
                     const AdapterContext& ctx) {
  Array y = conv1d(x, p[module + ".weight"], bias);
  Array down = lora_down(x, p, module, ctx);
  return down.defined() ? add(y, lora_up(down, p[lora_b_path(module)], ctx)) : y;
}

Array lora_delta_weight(const Array& a, const Array& b, const ParamRole& role, const Shape& weight_shape,
                        const LoraOptions& options) {
  autodiff::NoGradGuard no_grad;
  const int64_t r = a.dim(0);
  const int64_t out = b.numel() / r;
  // [out..., in]: every output row of the weight, flattened, against the input features.
  Array delta = mul(matmul(reshape(cast(b, DType::f32), {out, r}), cast(a, DType::f32)), options.scale());
  if (role.in_dim == weight_shape.ndim() - 1) return reshape(delta, weight_shape.dims());
  MT_CHECK(role.in_dim == 0, "[lora] cannot merge into a weight whose input dim is ", role.in_dim, " of ",
           weight_shape.str());
  return reshape(transpose(delta, {1, 0}), weight_shape.dims());  // Conv1D: [in, out...]
}

namespace {

Params fold_adapters(const Params& params, const std::vector<ParamDef>& base_defs, const LoraOptions& options,
                     double sign, bool keep_adapters) {
  autodiff::NoGradGuard no_grad;
  Params out;
  for (const auto& [path, value] : params)
    if (keep_adapters || !is_lora_path(path)) out.set(path, value);
  for (const LoraModule& m : lora_candidates(base_defs)) {
    const std::string a = lora_a_path(m.path), b = lora_b_path(m.path);
    if (!params.contains(a) && !params.contains(b)) continue;
    MT_CHECK(params.contains(a) && params.contains(b), "[lora] ", m.path, " has only one of lora_A and lora_B");
    const std::string w = m.path + ".weight";
    const Array& base = params[w];
    Array delta = lora_delta_weight(params[a], params[b], m.role, base.shape(), options);
    out.set(w, cast(add(cast(base, DType::f32), mul(delta, sign)), base.dtype()));
  }
  return out;
}

}  // namespace

Params merge_lora(const Params& params, const std::vector<ParamDef>& base_defs, const LoraOptions& options) {
  return fold_adapters(params, base_defs, options, 1.0, false);
}

Params unmerge_lora(const Params& merged_with_adapters, const std::vector<ParamDef>& base_defs,
                    const LoraOptions& options) {
  return fold_adapters(merged_with_adapters, base_defs, options, -1.0, true);
}

}  // namespace mt::models
