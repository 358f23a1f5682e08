#pragma once
// Checkpoints written beside training (issue 45). A save stages this rank's arrays as host
// copies (the next step updates the live ones in place), then a thread writes its safetensors
// file while the steps go on; the commit — meta.json and the atomic rename, collective — runs
// on the training thread at the first step after every rank's file is written (the trainer
// asks after every step; with several processes the ranks agree in one small all-reduce);
// always at the end of fit or before an interrupted run stops. So a checkpoint is the newest only once every rank's file is
// whole (as a foreground save). The copy costs host memory the size of this rank's share of the state, so by default
// (auto) only a state on a GPU is written so, and only when its copy fits in half the memory
// available; on the CPU the copy would share the memory the training state is sized by, and a
// run asks for it (FitOptions::background_checkpoints, --checkpoint-writes background).
#include <atomic>
#include <exception>
#include <optional>
#include <thread>

#include "meshtrain/train/checkpoint.h"

namespace mt::train {

class BackgroundCheckpoints {
 public:
  // `background`: nullopt chooses at each save (a GPU state whose copy fits; see above).
  BackgroundCheckpoints(const dist::Mesh& mesh, std::optional<bool> background);
  // Waits for the write in flight; with one process also commits it (several processes
  // commit together, which an unwinding rank cannot ask of the others: that checkpoint stays
  // incomplete and an earlier one remains the newest).
  ~BackgroundCheckpoints();
  BackgroundCheckpoints(const BackgroundCheckpoints&) = delete;
  BackgroundCheckpoints& operator=(const BackgroundCheckpoints&) = delete;

  // Collective. Commits the save in flight, then stages `state` and writes it.
  void save(const CheckpointManager& manager, const CheckpointState& state);
  // Collective. As save, into "best", when `value` beats the stored best; returns whether.
  bool save_best(const CheckpointManager& manager, const CheckpointState& state, const BestMetric& metric,
                 double value);
  // Collective: waits for the write in flight and commits it; a failed write is rethrown
  // here (its file named) on the rank that failed, and the others throw with it, uncommitted.
  void complete();
  // Collective with several processes (every rank calls it at the same points): commits the
  // save in flight once every rank's file is written, so that a crash after that loses nothing
  // of it (a failed write is rethrown here, on the rank that failed).
  void commit_if_written();
  bool in_flight() const { return staged_.has_value(); }
  // How the last save was written (for its log line).
  bool last_in_background() const { return last_in_background_; }

 private:
  void start(const CheckpointManager& manager, StagedCheckpoint staged);
  void join();

  const dist::Mesh* mesh_;
  std::optional<bool> background_;
  std::optional<CheckpointManager> manager_;
  std::optional<StagedCheckpoint> staged_;
  std::thread writer_;
  std::exception_ptr error_;
  std::atomic<bool> written_{false};  // the writer thread is done (its file written, or failed)
  bool last_in_background_ = false;
};

}  // namespace mt::train
