// PyTorch oracle for tests: runs snippets of Python/torch code in a persistent
// /usr/bin/python3 worker (tests/support/torch_oracle.py) and returns results.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace mt::testing {

// A tensor crossing the oracle boundary. Values always travel as float64 in
// row-major order; `dtype` tells torch what to convert them to (float32,
// float64, bfloat16, float16, int8, uint8, int16, int32, int64, bool).
struct OracleTensor {
  std::vector<int64_t> shape;
  std::string dtype = "float32";
  std::vector<double> data;

  int64_t numel() const;
};

struct OracleResult {
  std::vector<OracleTensor> outputs;
  // One entry per input when cotangents were given (nullopt for integer/bool
  // inputs or inputs the outputs do not depend on); empty otherwise.
  std::vector<std::optional<OracleTensor>> grads;
};

class TorchOracle {
 public:
  // Process-wide worker; python+torch start on the first run() call.
  static TorchOracle& instance();

  // Executes `code` with x0..xN (and list `xs`) bound to `inputs`; the code
  // must assign `out` (tensor or tuple/list of tensors). With cotangents (one
  // per output) also returns vector-Jacobian products w.r.t. float inputs.
  // Throws std::runtime_error with the Python traceback on failure.
  OracleResult run(const std::string& code, const std::vector<OracleTensor>& inputs,
                   const std::vector<OracleTensor>& cotangents = {});

  // Value of torch.set_num_threads for each request (default 1).
  void set_torch_threads(int n) { torch_threads_ = n; }

  ~TorchOracle();
  TorchOracle(const TorchOracle&) = delete;
  TorchOracle& operator=(const TorchOracle&) = delete;

 private:
  TorchOracle() = default;
  void start();
  int stop();  // returns the wait status, or -1 if there was no child
  [[noreturn]] void fail_dead(const std::string& what);
  void write_all(const void* data, size_t n);
  void read_exact(void* data, size_t n);
  std::string read_line();

  std::mutex mu_;
  pid_t pid_ = -1;
  pid_t owner_pid_ = -1;  // forked children (gtest death tests) must not reap
  int to_child_ = -1;
  int from_child_ = -1;
  std::string rbuf_;  // bytes read past the end of the last header line
  int torch_threads_ = 1;
};

}  // namespace mt::testing
