#pragma once
// Checkpoints (DESIGN.md §6): a directory per checkpoint holding one safetensors file per
// rank — the blocks that rank owns (replicas write nothing twice) — and meta.json (step,
// epoch, mesh, every array's global shape, dtype and layout, plus free-form state such as
// RNG and data position). Saves go to a temporary directory that is renamed when complete,
// so a crash never leaves a half checkpoint as the newest. Restoring assembles each array
// from the blocks and lays it out for any mesh: a run saved on 4 ranks resumes on 1.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/distributed/mesh.h"
#include "meshtrain/distributed/sharding.h"

namespace mt::train {

struct CheckpointState {
  int64_t step = 0;
  int64_t epoch = 0;
  Params params;     // global arrays (sharded or not)
  Params opt_state;  // global arrays (sharded or not)
  nlohmann::json extra = nlohmann::json::object();  // rng, data position, metrics...
};

// The layout to restore each array into (by path); nullptr means replicated.
using SpecFn = std::function<dist::PartitionSpec(const std::string& group, const std::string& path)>;
// The live array a saved one may be read into (undefined: none), e.g. the Trainer's own
// parameters and optimizer state.
using IntoFn = std::function<Array(const std::string& group, const std::string& path)>;

// The metric a "best" checkpoint is kept by, parsed once from "max:<metric>" / "min:<metric>".
struct BestMetric {
  enum class Mode { max, min };
  std::string name;
  Mode mode = Mode::max;
  // Throws naming `spec` unless it is "max:<name>" or "min:<name>".
  static BestMetric parse(const std::string& spec);
  // Whether `value` beats `previous` (NaN never does).
  bool improves(double value, double previous) const;
  const char* mode_name() const { return mode == Mode::max ? "max" : "min"; }
};

// The directory name of step `step`'s checkpoint: "step_00000042".
std::string step_name(int64_t step);

// One rank's part of a checkpoint between staging and commit: the arrays it writes (host
// copies when staged to be written in the background), their offsets, and the meta.json that
// rank 0 writes at the commit.
struct StagedCheckpoint {
  std::string name;       // "step_00000042", "best"
  std::string tmp_dir;    // written here,
  std::string final_dir;  // renamed to this at the commit
  std::string file;       // this rank's safetensors file
  Params tensors;
  std::map<std::string, std::string> offsets;
  nlohmann::json meta;
  bool prune = false;  // drop step checkpoints beyond keep_last at the commit
};

class CheckpointManager {
 public:
  // Checkpoints live in `dir`/step_<N>; the newest `keep_last` are kept (0 keeps all).
  explicit CheckpointManager(std::string dir, int keep_last = 3);

  // Collective: every rank of `mesh` calls it with the same state. Returns the directory.
  std::string save(const CheckpointState& state, const dist::Mesh& mesh);
  // Like save, into `dir`/best, replaced only when `value` beats the stored one; returns
  // whether it was saved.
  bool save_best(const CheckpointState& state, const dist::Mesh& mesh, const BestMetric& metric, double value);

  // Newest complete checkpoint directory (meta.json present), if any.
  std::optional<std::string> latest() const;
  std::vector<std::string> all() const;  // complete checkpoints, oldest first

  // Collective over `mesh`: reads `path` and lays every array out as `spec_for` says.
  // A missing or corrupt file is an mt::Error naming it. Where `into` names a live host array
  // of the saved shape and dtype (laid out as spec_for says), the saved values are written
  // into its buffer, tensor by tensor, and the state holds that same array: a resume then
  // needs no second copy of the state, and Adam's moments stay views of their flat buffer.
  // When any array `into` offers differs in shape or dtype, none is written into.
  static CheckpointState restore(const std::string& path, const dist::Mesh& mesh, const SpecFn& spec_for = {},
                                 const IntoFn& into = {});

  const std::string& dir() const { return dir_; }
  int keep_last() const { return keep_last_; }

  // A save in three parts, so that the file writing can run beside training
  // (train/background_checkpoints.h). stage — collective: prepares the temporary directory
  // and takes this rank's arrays (the live ones: a background writer copies them first).
  // write_files — this rank's file; no communication, any thread. commit — collective:
  // meta.json, the rename, and the pruning of old steps.
  StagedCheckpoint stage(const CheckpointState& state, const dist::Mesh& mesh, const std::string& name,
                         const nlohmann::json& extra_meta) const;
  static void write_files(const StagedCheckpoint& staged);
  std::string commit(const StagedCheckpoint& staged, const dist::Mesh& mesh) const;
  // Whether `value` would replace the stored best (by `metric`); NaN and infinities never do.
  bool beats_best(const BestMetric& metric, double value) const;
  static nlohmann::json best_meta(const BestMetric& metric, double value);

 private:
  std::string dir_;
  int keep_last_;
};

}  // namespace mt::train
