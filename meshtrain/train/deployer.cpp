#include "meshtrain/train/deployer.h"

#include <iostream>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/hosts.h"
#include "meshtrain/distributed/spmd.h"

namespace mt::train {

Deployer::Deployer(DeployerOptions options) : options_(std::move(options)) {
  mesh_ = !options_.mesh.empty() ? dist::Mesh::from_string(options_.mesh)
                                 : dist::Mesh::from_model_shards(std::max(1, options_.n_model_shards));
  device_ = Device::parse(options_.device);
  set_default_device(device_);
  std::string where = device_.str();
  if (device_.is_cuda()) where += " (" + cuda_runtime().describe(device_.index) + ")";
  // Where the ranks run (gathered by the mesh): on the start-up line,
  // and a warning when a tensor-parallel group would talk across hosts.
  hosts_ = mesh_.hosts();
  const std::string on_hosts = mesh_.comm().size() > 1 ? " on " + dist::describe_hosts(hosts_) : "";
  if (options_.verbose)
    log("meshtrain: " + std::to_string(mesh_.comm().size()) + " process(es)" + on_hosts + ", mesh " + mesh_.str() +
        ", device " + where);
  const std::vector<std::string> split = dist::groups_spanning_hosts(mesh_, "model", hosts_);
  if (!split.empty())
    log("meshtrain: warning: the model axis spans hosts (" + split[0] + (split.size() > 1 ? ", ..." : "") +
        "): every layer's tensor-parallel all-reduce crosses the network. Run a multiple of the model axis's "
        "size on each host (e.g. --host a:4,b:4) and put 'model' last in --mesh.");
}

int Deployer::data_index() const {
  return mesh_.has_axis(options_.data_axis) ? mesh_.axis_index(options_.data_axis) : 0;
}

int Deployer::data_size() const { return mesh_.has_axis(options_.data_axis) ? mesh_.axis_size(options_.data_axis) : 1; }

optim::Schedule Deployer::lr_schedule(int64_t train_size, int64_t per_device_batch_size, int64_t num_epochs,
                                      double learning_rate, const std::string& schedule_type, double warmup_rate,
                                      int grad_accum_steps) const {
  MT_CHECK(per_device_batch_size > 0 && num_epochs > 0 && grad_accum_steps > 0, "[lr_schedule] batch size, epochs and ",
           "accumulation must be positive");
  MT_CHECK(warmup_rate >= 0 && warmup_rate < 1, "[lr_schedule] warmup_rate must be in [0, 1), got ", warmup_rate);
  const int64_t global_batch = per_device_batch_size * data_size() * grad_accum_steps;
  const int64_t total = train_size / global_batch * num_epochs;
  MT_CHECK(total > 0, "[lr_schedule] ", train_size, " examples make no step of ", global_batch);
  const int64_t warmup = int64_t(double(total) * warmup_rate);
  if (schedule_type == "constant")
    return warmup > 0 ? optim::join_schedules({optim::linear_schedule(0.0, learning_rate, warmup),
                                               optim::constant_schedule(learning_rate)},
                                              {warmup})
                      : optim::constant_schedule(learning_rate);
  if (schedule_type == "linear") return optim::warmup_linear_decay_schedule(learning_rate, warmup, total);
  if (schedule_type == "cosine") return optim::warmup_cosine_decay_schedule(0.0, learning_rate, warmup, total);
  throw Error(detail::concat("[lr_schedule] unknown schedule_type '", schedule_type, "' (linear, cosine or constant)"));
}

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
