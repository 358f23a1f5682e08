#pragma once
// The Deployer (DESIGN.md §7): where a run executes and what it shares across ranks — the
// mesh (from "data=2,model=2" or a number of model shards), seeds and per-step random keys,
// the working directory, rank-0 logging, sharding rules and turning each process's part of
// a batch into global arrays.
#include <string>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/distributed/mesh.h"
#include "meshtrain/optim/schedule.h"
#include "meshtrain/train/sharding_rules.h"

namespace mt::train {

// A batch: named arrays whose first dimension indexes examples.
using Batch = Params;

struct DeployerOptions {
  uint64_t seed = 0;
  std::string mesh{};      // e.g. "data=2,model=2"; empty: from n_model_shards
  int n_model_shards = 1;  // model = n, data = world / n
  std::string workdir = "runs/default";
  std::string data_axis = "data";
  bool verbose = true;
  // Where parameters, optimizer state and batches live: "auto" (the GPU when one is visible),
  // "cpu", "cuda" or "cuda:N". The Deployer makes it the process's default device.
  std::string device = "auto";
};

class Deployer {
 public:
  explicit Deployer(DeployerOptions options = {});

  const dist::Mesh& mesh() const { return mesh_; }
  // The host of each rank of the mesh (distributed/hosts.h), by rank.
  const std::vector<std::string>& hosts() const { return hosts_; }
  Device device() const { return device_; }
  const DeployerOptions& options() const { return options_; }
  const std::string& workdir() const { return options_.workdir; }
  bool is_main() const { return mesh_.comm().rank() == 0; }
  // This process's position along the data axis (which slice of each global batch it
  // collates) and the number of such slices.
  int data_index() const;
  int data_size() const;

  RngKey init_key() const { return RngKey{options_.seed, 0}.fold_in(0x1417); }
  // The key of training step `step` (dropout etc.), the same on every rank.
  RngKey step_key(int64_t step) const { return RngKey{options_.seed, 1}.fold_in(uint64_t(step)); }
  // step_key's root: the step is folded into it last (RngKey::folding_last), on the device.
  RngKey step_key_root() const { return RngKey{options_.seed, 1}; }

  // Redco's get_lr_schedule_fn: the optimizer steps of `num_epochs` over `train_size`
  // examples at this mesh's global batch (per_device_batch_size x data size x accumulation),
  // `warmup_rate` of them warming up linearly from 0, then "linear" decay to 0, "cosine"
  // decay to 0 or "constant".
  optim::Schedule lr_schedule(int64_t train_size, int64_t per_device_batch_size, int64_t num_epochs, double learning_rate,
                              const std::string& schedule_type = "linear", double warmup_rate = 0.0,
                              int grad_accum_steps = 1) const;

  ShardingPlan sharding_rules(const Params& params, const models::ParamRoles& roles, ShardingOptions options = {}) const;
  // This process's slice of a global batch (dim 0) -> global arrays split over the data axis.
  Batch shard_batch(const Batch& local) const;
  // Prints on rank 0 only.
  void log(const std::string& line) const;

 private:
  DeployerOptions options_;
  dist::Mesh mesh_;
  std::vector<std::string> hosts_;
  Device device_;
};

}  // namespace mt::train
