#include "meshtrain/distributed/mpi_runtime.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

#include "meshtrain/backend/matmul.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/trace.h"
#include "meshtrain/distributed/hosts.h"
#include "meshtrain/distributed/peer_watch.h"

namespace mt::dist::internal {

namespace {
// Set once MPI is up; read by the exit handler and abort_job (which may run before instance()).
std::atomic<MpiRuntime*> g_runtime{nullptr};
std::atomic<bool> g_loop_running{false};
std::atomic<bool> g_skip_finalize{false};

const char* env_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name)) return v;
  return "?";
}
}  // namespace

void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = std::snprintf(text, sizeof text, "MPI error %d", rc);
  throw Error(::mt::detail::concat("[comm] ", what, " failed: ", std::string(text, size_t(len))));
}

MpiRuntime& MpiRuntime::instance() {
  static MpiRuntime* const runtime = new MpiRuntime();  // leaked: the exit handler finalizes MPI
  static const std::string error = [] {
    try {
      runtime->start();
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  }();
  // MPI_Init may run only once per process, so a failed start is remembered, not retried.
  if (!error.empty()) throw Error(error);
  return *runtime;
}

void MpiRuntime::start() {
  if (const char* t = std::getenv("MT_COMM_TIMEOUT_S")) {
    char* end = nullptr;
    timeout_s_ = std::strtod(t, &end);
    MT_CHECK(end != t && *end == '\0' && timeout_s_ >= 0, "[comm] MT_COMM_TIMEOUT_S='", t,
             "' is not a number of seconds (0 disables the hang watchdog)");
  }
  // Blocking MPI waits spin; with compute threads on the same cores (overlapped gradient
  // all-reduces) yielding in the wait loop measured faster for both. The user's setting wins.
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  thread_ = std::thread([this] { thread_main(); });
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return started_; });
  }
  if (!init_error_.empty()) {
    thread_.join();
    throw Error(init_error_);
  }
  if (timeout_s_ > 0) watchdog_ = std::thread([this] { watchdog_main(); });
  g_runtime.store(this);
  std::atexit([] { g_runtime.load()->shutdown(); });
}

void MpiRuntime::thread_main() {
  trace::name_this_thread("communication");
  int provided = 0;
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  if (rc == MPI_SUCCESS && provided >= MPI_THREAD_FUNNELED) start_peer_watch();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rc != MPI_SUCCESS) {
      init_error_ = ::mt::detail::concat("[comm] MPI_Init_thread failed with code ", rc);
    } else if (provided < MPI_THREAD_FUNNELED) {
      init_error_ = ::mt::detail::concat("[comm] MPI provides thread level ", provided,
                           " but meshtrain needs MPI_THREAD_FUNNELED (one thread makes every MPI call)");
      MPI_Finalize();
    } else {
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
      if (world_size_ > 1) cuda::set_matmul_tuning(false);
      g_loop_running.store(true);
    }
    started_ = true;
  }
  cv_.notify_all();
  if (!init_error_.empty()) return;

  for (;;) {
    Task task;
    {
      // No spinning here or in CommState::wait: measured 5x slower small collectives on 2 cores,
      // where spinning threads take the core MPI needs.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || stopping_.load() || abort_requested_.load(); });
      if (abort_requested_.load() || queue_.empty()) break;  // abort, or exiting with the queue drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    set_busy(&task.what);
    std::string error;
    std::optional<trace::Span> span;  // the collective as it runs on this thread
    if (trace::enabled())
      span.emplace("collective", task.what.substr(0, task.what.find_first_of("( ")),
                   trace::arg("what", task.what) + ", " + trace::arg("bytes", task.bytes));
    try {
      task.work();
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "[comm] " + task.what + " failed with an unknown exception";
    }
    span.reset();
    set_busy(nullptr);
    if (task.state) task.state->finish(std::move(error));
  }
  if (abort_requested_.load()) {
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }
  g_loop_running.store(false);
  const std::string what = "MPI_Finalize at exit (waits for every rank to finish)";
  set_busy(&what);
  MPI_Finalize();
  set_busy(nullptr);
}

void MpiRuntime::start_peer_watch() {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) return;
  // Host names as the mesh shows them, gathered with MPI itself: the communicators that
  // host_of_ranks uses run on this thread's loop, which has not started yet.
  constexpr int kKeyBytes = 320;
  char mine[kKeyBytes] = {};
  std::snprintf(mine, sizeof mine, "%s", host_key().c_str());
  std::vector<char> all(size_t(kKeyBytes) * size_t(size));
  MPI_Allgather(mine, kKeyBytes, MPI_CHAR, all.data(), kKeyBytes, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.emplace_back(all.data() + size_t(r) * kKeyBytes);
  // Silence means a lost host well before the collective watchdog would fire, and never after
  // less than 5 s (a stalled scheduler is not a lost host).
  const double silence_s = timeout_s_ > 0 ? std::clamp(timeout_s_ / 2, 5.0, 60.0) : 0.0;
  std::string warning;
  peer_watch_ = PeerWatch::start(rank, size, host_display_names(keys), silence_s, &warning);
  if (!warning.empty()) std::fprintf(stderr, "[rank %d] %s\n", rank, warning.c_str());
}

void MpiRuntime::say_goodbye() {
  if (peer_watch_) peer_watch_->say_goodbye();
}

void MpiRuntime::set_busy(const std::string* what) {
  std::lock_guard<std::mutex> lock(watch_mu_);
  busy_what_ = what;
  busy_since_ = std::chrono::steady_clock::now();
}

void MpiRuntime::watchdog_main() {
  const auto period = std::chrono::milliseconds(int64_t(std::clamp(timeout_s_ * 250.0, 10.0, 1000.0)));
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_stop_) {
    watch_cv_.wait_for(lock, period);
    if (!busy_what_) continue;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - busy_since_).count();
    if (waited <= timeout_s_) continue;
    std::fprintf(stderr,
                 "[rank %d] [comm] %s has not completed after %.0f s (MT_COMM_TIMEOUT_S): the ranks are "
                 "probably issuing different collectives, or a rank stopped or is stuck. Ending the job.\n",
                 world_rank_, busy_what_->c_str(), waited);
    if (peer_watch_) {
      const std::string quiet = peer_watch_->silent_peers(3.0);
      if (!quiet.empty()) std::fprintf(stderr, "[rank %d] [comm] peers not heard from: %s\n", world_rank_, quiet.c_str());
      peer_watch_->say_goodbye();  // this rank printed why it ends: peers must not call it failed
    }
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(1);  // mpirun ends the other ranks when one exits with an error
  }
}

std::shared_ptr<CommState> MpiRuntime::submit(std::string what, std::function<void()> work, double bytes) {
  auto state = std::make_shared<CommState>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) {
      state->finish("[comm] " + what + " issued after MPI was finalized (during exit)");
      return state;
    }
    queue_.push_back(Task{std::move(what), std::move(work), state, bytes});
  }
  cv_.notify_one();
  return state;
}

void MpiRuntime::run(std::string what, std::function<void()> work) {
  MT_CHECK(!on_comm_thread(), "[comm] ", what, " issued from the communication thread itself");
  const std::string& error = submit(std::move(what), std::move(work))->wait();
  if (!error.empty()) throw Error(error);
}

void MpiRuntime::skip_finalize() { g_skip_finalize.store(true); }

void MpiRuntime::shutdown() {
  // Exiting on purpose, with or without an error this process printed itself.
  say_goodbye();
  // A failing rank leaves the communication thread parked (possibly inside a collective its
  // peers never join); the process exit ends it and mpirun stops the job.
  if (g_skip_finalize.load()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) return;
    stopping_.store(true);
  }
  cv_.notify_all();
  if (thread_.joinable() && !on_comm_thread()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void MpiRuntime::abort_job(const std::string& message) {
  std::fprintf(stderr, "[rank %s] %s\n", env_rank(), message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  MpiRuntime* runtime = g_runtime.load();
  if (runtime) runtime->say_goodbye();  // the message above is the cause, not a lost peer
  if (runtime && g_loop_running.load()) {
    if (runtime->on_comm_thread()) MPI_Abort(MPI_COMM_WORLD, 1);
    {
      std::lock_guard<std::mutex> lock(runtime->mu_);
      runtime->abort_requested_.store(true);
    }
    runtime->cv_.notify_all();
    // MPI_Abort on the comm thread ends this process too; if that thread is stuck in a
    // collective, fall through and exit, which makes mpirun end the job.
    std::this_thread::sleep_for(std::chrono::seconds(5));
  }
  std::_Exit(1);
}

}  // namespace mt::dist::internal
