#include "meshtrain/train/gemm_peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/io/mapped_file.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/random.h"

namespace mt::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown cpu";
}

}  // namespace

double measure_gemm_gflops(DType dtype, int64_t n, int max_runs, double budget_s) {
  autodiff::NoGradGuard no_grad;
  Array a = random_normal(RngKey{11, 0}, {n, n}, dtype), b = random_normal(RngKey{12, 0}, {n, n}, dtype);
  matmul(a, b);  // warm-up: kernel creation, page faults, thread pool
  double best = 0, spent = 0;
  for (int i = 0; i < max_runs && spent < budget_s; ++i) {
    synchronize(a.device());  // a GPU product is timed to its completion, not its enqueue
    const auto t0 = std::chrono::steady_clock::now();
    Array c = matmul(a, b);
    synchronize(a.device());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spent += s;
    best = std::max(best, 2.0 * double(n) * double(n) * double(n) / s / 1e9);
  }
  return best;
}

std::string gemm_peak_cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path base = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  return (base / "meshtrain" / "gemm_peak.json").string();
}

std::string gemm_peak_key(DType dtype) {
  const Device device = current_device();
  if (device.is_cuda())  // the GPU's rate, which also depends on the f32 matmul precision (tf32)
    return cuda_runtime().describe(device.index) + " | " + matmul_precision_name(matmul_precision()) + " | " +
           dtype_name(dtype);
  return cpu_model() + " | " + cpu::cpu_features().isa + " | " + std::to_string(omp_get_max_threads()) + " threads | " +
         dtype_name(dtype);
}

double gemm_peak_gflops(DType dtype, bool use_cache) {
  const std::string path = gemm_peak_cache_path(), key = gemm_peak_key(dtype);
  json cache = json::object();
  try {
    if (fs::exists(path)) cache = json::parse(std::ifstream(path));
  } catch (const std::exception&) {
    cache = json::object();  // a damaged cache is re-measured, never an error
  }
  if (use_cache && cache.is_object() && cache.contains(key) && cache[key].is_number() && cache[key].get<double>() > 0)
    return cache[key].get<double>();
  const double peak = measure_gemm_gflops(dtype, 1024, 50, 0.4);
  try {
    if (!cache.is_object()) cache = json::object();
    cache[key] = peak;
    fs::create_directories(fs::path(path).parent_path());
    io::write_file_atomic(path, cache.dump(2) + "\n");
  } catch (const std::exception&) {
    // A read-only home still gets the measured peak, just not cached.
  }
  return peak;
}

}  // namespace mt::train
