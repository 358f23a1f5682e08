#include "meshtrain/train/background_checkpoints.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "meshtrain/core/device.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/train/available_memory.h"

namespace mt::train {

namespace {

double staged_bytes(const StagedCheckpoint& staged) {
  double bytes = 0;
  for (const auto& [key, a] : staged.tensors) bytes += double(a.nbytes());
  return bytes;
}

}  // namespace

BackgroundCheckpoints::BackgroundCheckpoints(const dist::Mesh& mesh, std::optional<bool> background)
    : mesh_(&mesh), background_(background) {}

BackgroundCheckpoints::~BackgroundCheckpoints() {
  join();
  if (!staged_) return;
  if (mesh_->comm().size() == 1 && !error_) {
    try {
      manager_->commit(*staged_, *mesh_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[checkpoint] %s was not completed: %s\n", staged_->final_dir.c_str(), e.what());
    }
  }
}

void BackgroundCheckpoints::join() {
  if (writer_.joinable()) writer_.join();
}

void BackgroundCheckpoints::complete() {
  join();
  if (!staged_) return;
  StagedCheckpoint staged = std::move(*staged_);
  staged_.reset();
  // Several processes agree on whether any write failed before the commit, whose barriers a
  // rank that failed would never reach: then every rank throws and none commits (the previous
  // checkpoint stays the newest).
  int32_t failed = error_ ? 1 : 0;
  dist::Communicator& comm = mesh_->comm();
  if (comm.size() > 1) comm.all_reduce(&failed, 1, DType::i32, dist::ReduceOp::sum);
  if (error_) {
    std::exception_ptr e = std::exchange(error_, nullptr);
    std::rethrow_exception(e);
  }
  MT_CHECK(failed == 0, "[checkpoint] ", staged.final_dir, " is not committed: the write failed on ", failed,
           " other rank(s) (their error names the file)");
  manager_->commit(staged, *mesh_);
}

void BackgroundCheckpoints::start(const CheckpointManager& manager, StagedCheckpoint staged) {
  // Auto: in the background when the state lives on a GPU and its host copy fits in half the
  // available memory. On the CPU the copy would compete with the training state itself for the
  // same memory (the peak a run is sized by would grow by the state), so it is asked for.
  // The training device, not the staged tensors' (a rank that writes no tensor has none).
  const bool on_gpu = !current_device().is_cpu();
  bool background = background_.value_or(on_gpu && staged_bytes(staged) <= 0.5 * available_memory_bytes());
  // Every rank must take the same path: the foreground commits now (two barriers), the
  // background at the next save. A rank that writes nothing, or reads less free memory, would
  // otherwise meet the others' next collective with a barrier: a hang. In the background only
  // if all ranks can.
  dist::Communicator& comm = mesh_->comm();
  if (!background_ && comm.size() > 1) {
    int32_t foreground = background ? 0 : 1;
    comm.all_reduce(&foreground, 1, DType::i32, dist::ReduceOp::max);
    background = foreground == 0;
  }
  last_in_background_ = background;
  if (!background) {
    CheckpointManager::write_files(staged);
    manager.commit(staged, *mesh_);
    return;
  }
  // The live arrays change with the next step: the thread writes copies (a GPU array comes to
  // host memory, where the writer reads it).
  for (auto& [key, a] : staged.tensors) a = a.device().is_cpu() ? a.clone() : a.to(Device::cpu());
  manager_.emplace(manager);
  staged_.emplace(std::move(staged));
  written_ = false;
  writer_ = std::thread([this] {
    try {
      CheckpointManager::write_files(*staged_);
    } catch (...) {
      error_ = std::current_exception();
    }
    written_ = true;
  });
}

void BackgroundCheckpoints::commit_if_written() {
  if (!staged_) return;
  // Several processes commit together, once every rank's file is written: one 4-byte
  // all-reduce per poll while a save is in flight (every rank polls after the same steps and
  // has the same save in flight, as they agreed on the background path).
  int32_t pending = written_.load() ? 0 : 1;  // summed: the ranks still writing
  dist::Communicator& comm = mesh_->comm();
  if (comm.size() > 1) comm.all_reduce(&pending, 1, DType::i32, dist::ReduceOp::sum);
  if (pending == 0) complete();
}

void BackgroundCheckpoints::save(const CheckpointManager& manager, const CheckpointState& state) {
  complete();
  StagedCheckpoint staged = manager.stage(state, *mesh_, step_name(state.step), nlohmann::json::object());
  staged.prune = true;
  start(manager, std::move(staged));
}

bool BackgroundCheckpoints::save_best(const CheckpointManager& manager, const CheckpointState& state,
                                      const BestMetric& metric, double value) {
  complete();  // a best in flight is compared once it is on disk
  if (!manager.beats_best(metric, value)) return false;
  start(manager, manager.stage(state, *mesh_, "best", CheckpointManager::best_meta(metric, value)));
  return true;
}

}  // namespace mt::train
