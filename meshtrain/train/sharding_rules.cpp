#include "meshtrain/train/sharding_rules.h"

#include <iomanip>
#include <regex>
#include <sstream>
#include <unordered_map>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/sharding.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/models/lora.h"

namespace mt::train {

using dist::PartitionSpec;
using models::ParamKind;

ShardingPlan::ShardingPlan(dist::Mesh mesh, std::vector<PlanEntry> entries)
    : mesh_(std::move(mesh)), entries_(std::move(entries)) {}

const PartitionSpec& ShardingPlan::spec(const std::string& path) const {
  for (const PlanEntry& e : entries_)
    if (e.path == path) return e.spec;
  throw Error("[sharding_rules] the plan has no parameter '" + path + "'");
}

Params ShardingPlan::shard(const Params& host) const { return shard(Params(host)); }

Params ShardingPlan::shard(Params&& host) const {
  Params out;
  for (auto& [path, value] : host) {
    out.set(path, dist::shard(value, mesh_, spec(path), path));
    value = Array();
  }
  host = Params{};
  return out;
}

std::string ShardingPlan::table() const {
  size_t w = 4;
  for (const PlanEntry& e : entries_) w = std::max(w, e.path.size());
  std::ostringstream os;
  os << std::left << std::setw(int(w)) << "path" << "  " << std::setw(16) << "shape" << "  " << std::setw(28) << "spec"
     << "  " << std::right << std::setw(12) << "bytes/rank" << "  reason\n";
  int64_t total = 0, full = 0;
  for (const PlanEntry& e : entries_) {
    os << std::left << std::setw(int(w)) << e.path << "  " << std::setw(16) << e.shape.str() << "  " << std::setw(28)
       << e.spec.str() << "  " << std::right << std::setw(12) << e.bytes_per_rank << "  " << e.reason << "\n";
    total += e.bytes_per_rank;
    full += e.shape.numel() * int64_t(dtype_size(e.dtype));
  }
  os << "total bytes per rank: " << total << " of " << full << " (mesh " << mesh_.str() << ")\n";
  return os.str();
}

namespace {

bool divisible(const Shape& s, int dim, int64_t n) { return dim >= 0 && dim < s.ndim() && n > 0 && s[dim] % n == 0; }

// A LoRA adapter takes its base weight's layout: A [r, in] splits its input features as the
// weight does, B [out..., r] its output features, so the adapter's matmuls split with the
// base layer's (column-parallel: B split, row-parallel: A split and one reduction).
void lay_out_adapter(PlanEntry& e, const PlanEntry* w, const models::ParamRoles& roles,
                     const dist::Mesh& mesh, const std::vector<std::pair<std::regex, PartitionSpec>>& overrides,
                     const ShardingOptions& options) {
  e.spec.dims.assign(size_t(e.shape.ndim()), {});
  for (size_t i = 0; i < overrides.size(); ++i)
    if (std::regex_match(e.path, overrides[i].first)) {
      e.spec = overrides[i].second;
      e.reason = "override '" + options.overrides[i].first + "'";
      break;
    }
  if (e.reason.empty()) {
    const std::string base = models::lora_base_weight_path(e.path);
    auto role_it = roles.find(base);
    if (w == nullptr || role_it == roles.end()) {
      e.reason = "LoRA adapter: replicated (no base weight " + base + ")";
    } else {
      const models::ParamRole& role = role_it->second;
      const bool is_a = roles.at(e.path).kind == ParamKind::lora_a;
      if (is_a) {
        e.spec.dims[1] = w->spec.dims[size_t(role.in_dim)];
      } else {
        size_t j = 0;
        for (int d = 0; d < w->shape.ndim(); ++d)
          if (d != role.in_dim) e.spec.dims[j++] = w->spec.dims[size_t(d)];
      }
      e.reason = std::string("LoRA ") + (is_a ? "A: input features" : "B: output features") + " as " + base;
    }
  }
  dist::Sharding sharding{mesh, e.spec};
  sharding.validate(e.shape, e.path);
  e.bytes_per_rank = sharding.local_shape(e.shape).numel() * int64_t(dtype_size(e.dtype));
}

}  // namespace

ShardingPlan auto_sharding_rules(const Params& params, const dist::Mesh& mesh, const models::ParamRoles& roles,
                                 const ShardingOptions& options) {
  std::vector<std::pair<std::regex, PartitionSpec>> overrides;
  for (const auto& [pattern, spec] : options.overrides) {
    try {
      overrides.emplace_back(std::regex(pattern), spec);
    } catch (const std::regex_error& e) {
      throw Error("[sharding_rules] invalid override regex '" + pattern + "': " + e.what());
    }
  }
  const bool has_model = mesh.has_axis(options.model_axis) && mesh.axis_size(options.model_axis) > 1;
  const int64_t model_size = has_model ? mesh.axis_size(options.model_axis) : 1;
  const bool has_data = mesh.has_axis(options.data_axis) && mesh.axis_size(options.data_axis) > 1;
  const int64_t data_size = has_data ? mesh.axis_size(options.data_axis) : 1;
  bool next_dense_out = true;  // "other" dense layers alternate column / row parallel

  std::vector<PlanEntry> entries;
  std::vector<size_t> adapters;  // entries laid out after their base weights
  for (const auto& [path, value] : params) {
    PlanEntry e{path, value.shape(), value.dtype(), {}, 0, ""};
    auto role_it = roles.find(path);
    const ParamKind kind = role_it != roles.end() ? role_it->second.kind : ParamKind::other;
    if (kind == ParamKind::lora_a || kind == ParamKind::lora_b) {
      adapters.push_back(entries.size());
      entries.push_back(std::move(e));
      continue;
    }
    bool overridden = false;
    for (size_t i = 0; i < overrides.size(); ++i)
      if (std::regex_match(path, overrides[i].first)) {
        e.spec = overrides[i].second;
        e.reason = "override '" + options.overrides[i].first + "'";
        overridden = true;
        break;
      }
    if (!overridden) {
      auto it = roles.find(path);
      models::ParamRole role = it != roles.end() ? it->second : models::ParamRole{};
      const Shape& s = value.shape();
      int model_dim = -1;
      std::string why;
      if (s.ndim() < 2 || role.kind == ParamKind::bias || role.kind == ParamKind::norm) {
        why = "replicated (bias/norm/scalar)";
      } else {
        switch (role.kind) {
          case ParamKind::embedding:
            why = "embedding: first divisible dim";
            for (int d = 0; d < s.ndim(); ++d)
              if (divisible(s, d, model_size)) {
                model_dim = d;
                break;
              }
            break;
          case ParamKind::attention_qkv: model_dim = role.out_dim; why = "q/k/v: output features (column)"; break;
          case ParamKind::attention_out: model_dim = role.in_dim; why = "attention out: input features (row)"; break;
          case ParamKind::mlp_in: model_dim = role.out_dim; why = "MLP in: output features (column)"; break;
          case ParamKind::mlp_out: model_dim = role.in_dim; why = "MLP out: input features (row)"; break;
          case ParamKind::lm_head: model_dim = role.out_dim; why = "LM head: output features (vocab)"; break;
          case ParamKind::position_bias: model_dim = role.out_dim; why = "position bias: heads"; break;
          case ParamKind::input_projection: model_dim = role.in_dim; why = "input projection: input features (row)"; break;
          default: {
            // Undeclared matrices: output features (last dim by default) then input, in turn.
            int out = role.out_dim >= 0 ? role.out_dim : s.ndim() - 1;
            int in = role.in_dim >= 0 ? role.in_dim : s.ndim() - 2;
            model_dim = next_dense_out ? out : in;
            why = next_dense_out ? "dense: output features (alternating)" : "dense: input features (alternating)";
            next_dense_out = !next_dense_out;
          }
        }
      }
      e.spec.dims.assign(size_t(s.ndim()), {});
      if (!has_model) model_dim = -1;
      if (model_dim >= 0) {
        if (divisible(s, model_dim, model_size)) {
          e.spec.dims[size_t(model_dim)] = {options.model_axis};
        } else {
          why += "; dim " + std::to_string(model_dim) + " not divisible by " + options.model_axis + "=" +
                 std::to_string(model_size) + ": replicated";
          model_dim = -1;
        }
      }
      if (options.fsdp && has_data && s.numel() >= options.fsdp_min_elements && s.ndim() >= 1) {
        int best = -1;
        for (int d = 0; d < s.ndim(); ++d) {
          if (d == model_dim) continue;
          int64_t local = s[d];
          if (local % data_size == 0 && (best < 0 || local > s[best])) best = d;
        }
        if (best >= 0) {
          e.spec.dims[size_t(best)] = {options.data_axis};
          why += "; FSDP dim " + std::to_string(best);
        }
      }
      e.reason = has_model || options.fsdp ? why : "replicated (no model axis)";
    }
    dist::Sharding sharding{mesh, e.spec};
    sharding.validate(value.shape(), path);
    e.bytes_per_rank = sharding.local_shape(value.shape()).numel() * int64_t(dtype_size(value.dtype()));
    entries.push_back(std::move(e));
  }
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < entries.size(); ++i) index[entries[i].path] = i;
  for (size_t i : adapters) {
    auto base = index.find(models::lora_base_weight_path(entries[i].path));
    lay_out_adapter(entries[i], base == index.end() ? nullptr : &entries[base->second], roles, mesh, overrides, options);
  }
  return ShardingPlan(mesh, std::move(entries));
}

}  // namespace mt::train
