#pragma once
// Automatic sharding rules (Redco's algorithm, DESIGN.md §4): one PartitionSpec per
// parameter from the model's declared parameter roles, so tensor-parallel pairs line up
// (column-parallel q/k/v and MLP-in, row-parallel attention-out and MLP-out) with one
// all-reduce per pair; optional FSDP over the data axis; regex overrides, first match wins.
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/distributed/mesh.h"
#include "meshtrain/distributed/sharding.h"
#include "meshtrain/models/param_roles.h"

namespace mt::train {

struct ShardingOptions {
  std::string model_axis = "model";
  std::string data_axis = "data";
  // Also split each large parameter's largest remaining dimension over the data axis.
  bool fsdp = false;
  int64_t fsdp_min_elements = int64_t(1) << 14;
  // (regex over the whole path, spec): the first matching pattern decides a parameter.
  std::vector<std::pair<std::string, dist::PartitionSpec>> overrides{};
};

struct PlanEntry {
  std::string path;
  Shape shape;
  DType dtype;
  dist::PartitionSpec spec;
  int64_t bytes_per_rank = 0;
  std::string reason;  // why this layout ("q/k/v: output features", "override /.../", ...)
};

class ShardingPlan {
 public:
  ShardingPlan() = default;
  ShardingPlan(dist::Mesh mesh, std::vector<PlanEntry> entries);
  const dist::Mesh& mesh() const { return mesh_; }
  const std::vector<PlanEntry>& entries() const { return entries_; }
  // The spec of `path`; throws naming the path when the plan has no such parameter.
  const dist::PartitionSpec& spec(const std::string& path) const;
  // Host parameters -> parameters laid out by the plan (each rank keeps its block).
  Params shard(const Params& host) const;
  // The same, consuming `host`: each whole parameter is dropped as soon as its block exists,
  // so (when these were its only handles) the whole model never sits beside its shards and
  // the blocks fill the ranges the earlier whole parameters left.
  Params shard(Params&& host) const;
  // A table: path, shape, spec, bytes per rank (and totals).
  std::string table() const;

 private:
  dist::Mesh mesh_;
  std::vector<PlanEntry> entries_;
};

ShardingPlan auto_sharding_rules(const Params& params, const dist::Mesh& mesh, const models::ParamRoles& roles,
                                 const ShardingOptions& options = {});

}  // namespace mt::train
