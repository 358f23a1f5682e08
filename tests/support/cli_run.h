#pragma once
// Running the meshtrain binary from end-to-end tests: its exit code and combined output,
// echoed so a failing test shows what the command printed. MT_MESHTRAIN_BIN and
// MT_MPIRUN (the mpirun command line with its flags) come from tests/CMakeLists.txt.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

namespace mt::testing {

struct CliRun {
  int code = -1;        // exit code; -1 when killed by a signal
  std::string out;      // stdout, then stderr
  std::string std_out;  // stdout alone (what generate and eval print as results)
};

inline CliRun run_command(const std::string& command, const std::string& shown) {
  CliRun r;
  char err_path[] = "/tmp/mt_cli_stderr_XXXXXX";
  const int fd = mkstemp(err_path);
  if (fd < 0) return r;
  close(fd);
  FILE* p = popen((command + " 2>" + err_path).c_str(), "r");
  if (!p) {
    unlink(err_path);
    return r;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.std_out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  r.out = r.std_out + std::string(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  unlink(err_path);
  std::cout << "$ " << shown << "\n" << r.out << "[exit " << r.code << "]\n";
  return r;
}

// The binary under test: MT_MESHTRAIN_BIN from the build, or $MT_MESHTRAIN_BIN where the
// binaries were unpacked elsewhere (the GPU machine, scripts/gpu_run.sh).
inline std::string meshtrain_bin() {
  const char* env = std::getenv("MT_MESHTRAIN_BIN");
  return env && *env ? std::string(env) : std::string(MT_MESHTRAIN_BIN);
}

// `meshtrain <args>` in one process.
inline CliRun run_cli(const std::string& args) { return run_command(meshtrain_bin() + " " + args, "meshtrain " + args); }

#ifdef MT_MPIRUN
// `mpirun -np <ranks> meshtrain <args>`, one OpenMP thread per rank.
inline CliRun run_cli_mpi(int ranks, const std::string& args) {
  return run_command(std::string(MT_MPIRUN) + " -np " + std::to_string(ranks) + " -x OMP_NUM_THREADS=1 " +
                         MT_MESHTRAIN_BIN + " " + args,
                     "mpirun -np " + std::to_string(ranks) + " meshtrain " + args);
}
#endif

}  // namespace mt::testing
