#include "meshtrain/train/deployer.h"

#include <iostream>

#include "meshtrain/core/error.h"
#include "meshtrain/dist/spmd.h"

namespace mt::train {

Deployer::Deployer(DeployerOptions options) : options_(std::move(options)) {
  mesh_ = !options_.mesh.empty() ? dist::Mesh::from_string(options_.mesh)
                                 : dist::Mesh::from_model_shards(std::max(1, options_.n_model_shards));
  if (options_.verbose) log("meshtrain: " + std::to_string(mesh_.comm().size()) + " process(es), mesh " + mesh_.str());
}

int Deployer::data_index() const {
  return mesh_.has_axis(options_.data_axis) ? mesh_.axis_index(options_.data_axis) : 0;
}

int Deployer::data_size() const { return mesh_.has_axis(options_.data_axis) ? mesh_.axis_size(options_.data_axis) : 1; }

ShardingPlan Deployer::sharding_rules(const Params& params, const models::ParamRoles& roles,
                                      ShardingOptions options) const {
  options.data_axis = options_.data_axis;
  return auto_sharding_rules(params, mesh_, roles, options);
}

Batch Deployer::shard_batch(const Batch& local) const {
  if (data_size() == 1) return local;
  Batch out;
  for (const auto& [name, a] : local) {
    MT_CHECK(a.ndim() >= 1, "[deployer] batch field '", name, "' is a scalar ", a.str(), "; batch fields need a first (example) dimension");
    dist::PartitionSpec spec;
    spec.dims.push_back({options_.data_axis});
    out.set(name, dist::global_view(a, dist::Sharding{mesh_, spec}));
  }
  return out;
}

void Deployer::log(const std::string& line) const {
  if (is_main()) std::cout << line << std::endl;
}

}  // namespace mt::train
