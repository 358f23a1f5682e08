#pragma once
// MpiRuntime: the one thread that owns MPI. It calls MPI_Init_thread(FUNNELED) and then every
// MPI function of the process, running submitted work in FIFO order. Internal to meshtrain/dist
// (mpi.h stays out of this header); backends and benches submit closures that call MPI.
// The thread runs blocking collectives one at a time: overlap comes from the caller computing
// meanwhile, and blocking MPI_Allreduce measured ~2x the bandwidth of MPI_Iallreduce polled
// with MPI_Test (OpenMPI 4.1, shared memory). FIFO order on every rank keeps collectives matched.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "meshtrain/distributed/comm_handle.h"
#include "meshtrain/distributed/peer_watch.h"

namespace mt::dist::internal {

class MpiRuntime {
 public:
  // Starts the communication thread and MPI on first use; throws mt::Error if MPI fails to start.
  static MpiRuntime& instance();

  // Queues `work` behind every earlier submission; the returned state finishes with the
  // message of any exception `work` throws. `what` names the work in errors and the watchdog;
  // `bytes` (this rank's buffer) goes with it into the profile's collective span.
  std::shared_ptr<CommState> submit(std::string what, std::function<void()> work, double bytes = 0);
  // submit() and wait; rethrows the work's error as mt::Error.
  void run(std::string what, std::function<void()> work);

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // True once the exit handler has stopped accepting work.
  bool stopping() const { return stopping_.load(); }
  bool on_comm_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

  // abort_all under mpirun: prints `message`, then MPI_Abort on the communication thread; if
  // that thread is stuck inside a collective, exits this rank, which makes mpirun end the job.
  [[noreturn]] static void abort_job(const std::string& message);
  // The exit handler will leave MPI unfinalized (see dist::skip_finalize_at_exit).
  static void skip_finalize();

 private:
  struct Task {
    std::string what;
    std::function<void()> work;
    std::shared_ptr<CommState> state;
    double bytes = 0;
  };

  MpiRuntime() = default;
  void start();
  void thread_main();
  void watchdog_main();
  void shutdown();  // exit handler: drain the queue, MPI_Finalize, join threads
  void set_busy(const std::string* what);
  void start_peer_watch();  // comm thread, right after MPI_Init
  void say_goodbye();       // this process exits on its own: peers must not report it failed

  std::thread thread_;
  std::mutex mu_;  // guards queue_, started_, init_error_
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool started_ = false;
  std::string init_error_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> abort_requested_{false};
  std::string abort_message_;
  int world_rank_ = 0;
  int world_size_ = 1;

  // Watchdog: a rank whose collective never completes (ranks issuing different collectives,
  // a peer that stopped) is ended after MT_COMM_TIMEOUT_S seconds instead of hanging the job.
  std::thread watchdog_;
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  const std::string* busy_what_ = nullptr;  // the task in MPI right now, or null
  std::chrono::steady_clock::time_point busy_since_;
  double timeout_s_ = 1800;

  // Names a rank that died or a host that went silent within seconds (peer_watch.h); null in
  // one-process runs and where TCP between ranks is blocked.
  std::unique_ptr<PeerWatch> peer_watch_;
};

}  // namespace mt::dist::internal

namespace mt::dist::internal {
// Throws mt::Error "[comm] <what> failed: <MPI's message>" unless rc is MPI_SUCCESS.
// Comm thread only (it asks MPI for the message).
void check_mpi(int rc, const std::string& what);
}  // namespace mt::dist::internal
