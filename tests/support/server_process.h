#pragma once
// A `meshtrain serve` child process for end-to-end tests: started with --port 0, its port
// read from the "listening on" line, its memory readable, stopped with SIGTERM (SIGKILL
// if it does not end in time).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fcntl.h>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/cli_run.h"

namespace mt::testing {

class ServerProcess {
 public:
  // Starts `meshtrain serve <args>`; waits up to `timeout_s` for it to listen. stderr goes
  // to `log_path`.
  ServerProcess(const std::vector<std::string>& args, const std::string& log_path, int timeout_s = 120)
      : ServerProcess(serve_command(args), log_path, timeout_s, 0) {}

  // The same for any command line (mpirun ... meshtrain serve ...).
  ServerProcess(const std::vector<std::string>& command, const std::string& log_path, int timeout_s, int)
      : log_(log_path) {
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      const int err = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err >= 0) dup2(err, 2);
      close(out[0]);
      std::vector<std::string> all = command;
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    out_fd_ = out[0];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    const std::regex listening("listening on http://[^:]+:(\\d+)");
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) {
        if (waitpid(pid_, &status_, WNOHANG) == pid_) {
          exited_ = true;
          return;
        }
        continue;
      }
      char buf[512];
      const ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) return;
      stdout_.append(buf, size_t(n));
      std::smatch m;
      if (std::regex_search(stdout_, m, listening)) {
        port_ = std::stoi(m[1]);
        return;
      }
    }
  }
  ~ServerProcess() { stop(); }

  static std::vector<std::string> serve_command(const std::vector<std::string>& args) {
    std::vector<std::string> all = {meshtrain_bin(), "serve"};
    all.insert(all.end(), args.begin(), args.end());
    return all;
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  bool alive() { return pid_ > 0 && !exited_ && waitpid(pid_, &status_, WNOHANG) == 0; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Resident memory of the server, from /proc.
  int64_t rss_kb() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
    return -1;
  }

  // SIGTERM, then waits; returns the exit code (-1 if it had to be killed). Collects stdout.
  int stop(int timeout_s = 20) {
    if (pid_ <= 0 || stopped_) return code_;
    stopped_ = true;
    if (!exited_) {
      kill(pid_, SIGTERM);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
      while (waitpid(pid_, &status_, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          kill(pid_, SIGKILL);
          waitpid(pid_, &status_, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    char buf[4096];
    ssize_t n;
    while ((n = read(out_fd_, buf, sizeof buf)) > 0) stdout_.append(buf, size_t(n));
    close(out_fd_);
    code_ = WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
    return code_;
  }
  const std::string& std_out() const { return stdout_; }
  std::string log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  int out_fd_ = -1, port_ = -1, status_ = 0, code_ = -1;
  bool exited_ = false, stopped_ = false;
  std::string stdout_;
};

#ifdef MT_MPIRUN
// `mpirun -np <ranks> meshtrain serve <args>`, one OpenMP thread per rank.
inline std::vector<std::string> mpirun_serve_command(int ranks, const std::vector<std::string>& args) {
  std::vector<std::string> all;
  std::istringstream words(MT_MPIRUN);
  for (std::string w; words >> w;) all.push_back(w);
  for (const char* w : {"-np", "", "-x", "OMP_NUM_THREADS=1", "-x", "OMP_WAIT_POLICY=passive"}) all.push_back(w);
  all[all.size() - 5] = std::to_string(ranks);
  const std::vector<std::string> serve = ServerProcess::serve_command(args);
  all.insert(all.end(), serve.begin(), serve.end());
  return all;
}
#endif

// A word for /bin/sh: single-quoted, inner quotes escaped.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace mt::testing
