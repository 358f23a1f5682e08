#include "torch_oracle.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#ifndef MT_TORCH_ORACLE_SCRIPT
#define MT_TORCH_ORACLE_SCRIPT "tests/support/torch_oracle.py"
#endif

extern char** environ;

namespace mt::testing {
namespace {

// The wire format is raw little-endian float64; we copy doubles verbatim.
static_assert(std::endian::native == std::endian::little, "oracle assumes a little-endian host");

constexpr const char* kPython = "/usr/bin/python3";
constexpr const char* kScript = MT_TORCH_ORACLE_SCRIPT;
constexpr int kImportFailedExit = 3;  // torch_oracle.py's "cannot import torch" code

using json = nlohmann::json;

std::string sys_error(const std::string& what) {
  return "torch oracle: " + what + ": " + std::strerror(errno);
}

// Blocks SIGPIPE for this thread only while writing, so a dead worker shows up
// as EPIPE instead of killing the test binary, without touching global state.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  // Drops the SIGPIPE our failed write raised, so unblocking does not deliver it.
  void consume() {
    if (was_pending_) return;
    timespec zero{0, 0};
    while (sigtimedwait(&set_, nullptr, &zero) == -1 && errno == EINTR) {
    }
  }
  ~SigpipeGuard() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t set_;
  sigset_t old_;
  bool was_pending_ = false;
};

// dup2 onto 0/1 is a no-op if the pipe end already sits there, which would
// keep O_CLOEXEC set; move such fds out of the way first.
int above_stdio(int fd) {
  if (fd > 2) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  close(fd);
  return moved;
}

void close_fd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

json describe(const OracleTensor& t) { return {{"shape", t.shape}, {"dtype", t.dtype}}; }

void check_tensor(const OracleTensor& t, const char* role, size_t index) {
  if (static_cast<int64_t>(t.data.size()) != t.numel()) {
    throw std::invalid_argument("torch oracle: " + std::string(role) + " " +
                                std::to_string(index) + " has " + std::to_string(t.data.size()) +
                                " values but shape needs " + std::to_string(t.numel()));
  }
}

}  // namespace

int64_t OracleTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("torch oracle: negative dimension in shape");
    n *= d;
  }
  return n;
}

TorchOracle& TorchOracle::instance() {
  static TorchOracle oracle;
  return oracle;
}

TorchOracle::~TorchOracle() {
  if (pid_ > 0 && owner_pid_ == getpid()) stop();
}

void TorchOracle::start() {
  if (access(kScript, R_OK) != 0) {
    throw std::runtime_error(sys_error(std::string("cannot read worker script ") + kScript +
                                       " (check MT_TORCH_ORACLE_SCRIPT)"));
  }
  int to_child[2];
  int from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0) throw std::runtime_error(sys_error("pipe2"));
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    throw std::runtime_error(sys_error("pipe2"));
  }
  for (int* fd : {&to_child[0], &to_child[1], &from_child[0], &from_child[1]}) {
    *fd = above_stdio(*fd);
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
  // Give the worker a clean signal state even if the test binary ignores or
  // blocks signals (ignored dispositions survive exec).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigset_t defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  char* argv[] = {const_cast<char*>(kPython), const_cast<char*>(kScript), nullptr};
  pid_t pid = -1;
  // The reference runs on the machine's own path: PyTorch uses oneDNN too, and a cap meant
  // for meshtrain (ONEDNN_MAX_CPU_ISA=AVX2) would make its bf16 ops fail instead of fall back.
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    if (entry.rfind("ONEDNN_MAX_CPU_ISA=", 0) != 0 && entry.rfind("DNNL_MAX_CPU_ISA=", 0) != 0) env.push_back(*e);
  }
  env.push_back(nullptr);
  int rc = posix_spawn(&pid, kPython, &actions, &attr, argv, env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(to_child[0]);
  close(from_child[1]);
  if (rc != 0) {
    close(to_child[1]);
    close(from_child[0]);
    errno = rc;
    throw std::runtime_error(sys_error(std::string("cannot spawn ") + kPython));
  }
  pid_ = pid;
  owner_pid_ = getpid();
  to_child_ = to_child[1];
  from_child_ = from_child[0];
  rbuf_.clear();

  // The worker announces itself after importing torch; EOF here means the
  // import failed (fail_dead explains it from the exit status).
  std::string line = read_line();
  json hello = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!hello.is_object() || !hello.value("ready", false)) {
    stop();
    throw std::runtime_error("torch oracle: unexpected greeting from worker: " + line);
  }
}

int TorchOracle::stop() {
  close_fd(to_child_);  // EOF on stdin is the worker's signal to exit
  int status = -1;
  if (pid_ > 0) {
    // Bounded wait: a worker stuck in user code must not hang test teardown.
    bool reaped = false;
    for (int i = 0; i < 300 && !reaped; ++i) {
      pid_t r = waitpid(pid_, &status, WNOHANG);
      reaped = r == pid_ || (r < 0 && errno != EINTR);
      if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!reaped) {
      kill(pid_, SIGKILL);
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  close_fd(from_child_);
  pid_ = -1;
  rbuf_.clear();
  return status;
}

void TorchOracle::fail_dead(const std::string& what) {
  std::string msg = "torch oracle: worker `" + std::string(kPython) + " " + kScript + "` died " + what;
  int status = stop();
  if (status != -1 && WIFEXITED(status)) {
    msg += " (exit status " + std::to_string(WEXITSTATUS(status)) + ")";
    if (WEXITSTATUS(status) == kImportFailedExit) {
      msg += ": /usr/bin/python3 cannot import torch/numpy (install python3-torch)";
    }
  } else if (status != -1 && WIFSIGNALED(status)) {
    msg += " (killed by signal " + std::to_string(WTERMSIG(status)) + ")";
  }
  throw std::runtime_error(msg + "; see its stderr above");
}

void TorchOracle::write_all(const void* data, size_t n) {
  SigpipeGuard guard;
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = write(to_child_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      if (errno == EPIPE) {
        guard.consume();
        fail_dead("while receiving a request");
      }
      throw std::runtime_error(sys_error("write to worker"));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void TorchOracle::read_exact(void* data, size_t n) {
  if (n == 0) return;  // zero-size tensors may pass a null buffer
  auto* p = static_cast<char*>(data);
  size_t from_buf = std::min(n, rbuf_.size());
  std::memcpy(p, rbuf_.data(), from_buf);
  rbuf_.erase(0, from_buf);
  p += from_buf;
  n -= from_buf;
  while (n > 0) {
    ssize_t r = read(from_child_, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw std::runtime_error(sys_error("read from worker"));
    if (r == 0) fail_dead("mid-response");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

std::string TorchOracle::read_line() {
  size_t nl;
  while ((nl = rbuf_.find('\n')) == std::string::npos) {
    char chunk[4096];
    ssize_t r = read(from_child_, chunk, sizeof chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw std::runtime_error(sys_error("read from worker"));
    if (r == 0) fail_dead(pid_ > 0 && rbuf_.empty() ? "before answering" : "mid-header");
    rbuf_.append(chunk, static_cast<size_t>(r));
  }
  std::string line = rbuf_.substr(0, nl);
  rbuf_.erase(0, nl + 1);
  return line;
}

OracleResult TorchOracle::run(const std::string& code, const std::vector<OracleTensor>& inputs,
                              const std::vector<OracleTensor>& cotangents) {
  std::lock_guard lock(mu_);
  // Validate before writing anything so a bad call cannot desync the stream.
  for (size_t i = 0; i < inputs.size(); ++i) check_tensor(inputs[i], "input", i);
  for (size_t i = 0; i < cotangents.size(); ++i) check_tensor(cotangents[i], "cotangent", i);
  if (pid_ > 0 && owner_pid_ != getpid()) {
    throw std::runtime_error("torch oracle: cannot use the parent's worker from a forked child");
  }
  if (pid_ <= 0) start();

  json header = {{"code", code},
                 {"inputs", json::array()},
                 {"cotangents", json::array()},
                 {"torch_threads", torch_threads_}};
  for (const auto& t : inputs) header["inputs"].push_back(describe(t));
  for (const auto& t : cotangents) header["cotangents"].push_back(describe(t));
  std::string line = header.dump() + "\n";  // dump() escapes newlines in code
  write_all(line.data(), line.size());
  for (const auto* group : {&inputs, &cotangents}) {
    for (const auto& t : *group) write_all(t.data.data(), t.data.size() * sizeof(double));
  }

  json resp = json::parse(read_line(), nullptr, /*allow_exceptions=*/false);
  if (!resp.is_object()) {
    stop();  // framing is unknown now; restart on the next call
    throw std::runtime_error("torch oracle: malformed response header from worker");
  }
  if (!resp.value("ok", false)) {
    std::string error = resp.value("error", std::string("(no traceback)"));
    throw std::runtime_error("torch oracle: Python error:\n" + error);
  }

  auto read_tensor = [this](const json& spec) {
    OracleTensor t;
    t.shape = spec.at("shape").get<std::vector<int64_t>>();
    t.dtype = spec.at("dtype").get<std::string>();
    t.data.resize(static_cast<size_t>(t.numel()));
    read_exact(t.data.data(), t.data.size() * sizeof(double));
    return t;
  };
  OracleResult result;
  try {
    for (const auto& spec : resp.at("outputs")) result.outputs.push_back(read_tensor(spec));
    for (const auto& spec : resp.at("grads")) {
      if (spec.is_null()) {
        result.grads.emplace_back(std::nullopt);
      } else {
        result.grads.emplace_back(read_tensor(spec));
      }
    }
  } catch (const json::exception& e) {
    stop();  // payload length is unknown now; restart on the next call
    throw std::runtime_error(std::string("torch oracle: malformed response: ") + e.what());
  }
  return result;
}

}  // namespace mt::testing
