// One training step (forward, backward, AdamW) of miniGPT in meshtrain and in PyTorch on the
// same shapes and thread count, side by side, in f32 and in bf16 mixed precision (meshtrain:
// MatmulPrecision::bf16; PyTorch: CPU autocast to bfloat16): seconds per step, tokens/s, and
// MFU — model FLOPs per second over the GEMM peak of the same dtype measured in this run
// (mt::matmul on 2048³ f32 arrays, and on bf16 arrays).
// On a CPU without native bf16 GEMMs (AVX2) the bf16 peak is n/a: bf16 rows run the
// widened-to-f32 path and their MFU is taken against the f32 peak.
// Then the profiler's overhead: the same f32 steps with the --profile recorder on.
// Usage: train_step_bench [--quick]   (the demo's model and a wider one)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/models/minigpt.h"
#include "meshtrain/train/gemm_peak.h"
#include "meshtrain/train/profiler.h"

namespace {

using namespace mt;
using clock_type = std::chrono::steady_clock;

struct Config {
  const char* name;
  int64_t V, T, C, H, FF, L, B;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Best-of-5 GFLOP/s of a 2048³ matmul in `dtype`: the roof the MFU is measured against.
double gemm_peak_gflops(DType dtype) { return train::measure_gemm_gflops(dtype, 2048, 5, 1e9); }

// Matmul FLOPs of a step: 6 per weight per token (forward + two backward GEMMs) plus the
// attention scores and weighted sums (causal mask not discounted), as in the PaLM paper.
double step_flops(const Config& c) {
  const double weights = double(c.L) * (4.0 * c.C * c.C + 2.0 * c.C * c.FF) + double(c.V) * c.C;
  const double tokens = double(c.B * c.T);
  return 6.0 * weights * tokens + 12.0 * double(c.L) * double(c.T) * double(c.C) * tokens;
}

// `profiled`: with the --profile recorder on (op spans, VJP spans), to measure its overhead.
double meshtrain_step_seconds(const Config& c, int warmup, int steps, MatmulPrecision precision, bool profiled = false) {
  MatmulPrecisionScope scope(precision);
  models::MiniGptConfig mc;
  mc.vocab_size = c.V;
  mc.maxlen = c.T;
  mc.embed_dim = c.C;
  mc.num_heads = c.H;
  mc.feed_forward_dim = c.FF;
  mc.num_transformer_blocks = c.L;
  Params params = models::minigpt_init(mc, RngKey{0, 0});
  optim::Transform opt = optim::adamw(optim::constant_schedule(1e-3));
  Params state = opt.init(params);
  std::mt19937 rng(3);
  std::vector<int64_t> x(size_t(c.B * c.T)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = int64_t(rng() % uint64_t(c.V));
    y[i] = int64_t(rng() % uint64_t(c.V));
  }
  Array ids = Array::from_vector(x, {c.B, c.T}), labels = Array::from_vector(y, {c.B, c.T});
  std::vector<double> times;
  if (profiled) {
    trace::start();
    prim::set_op_observer(train::record_op_span);
  }
  for (int s = 0; s < warmup + steps; ++s) {
    auto t0 = clock_type::now();
    auto [loss, grads] = value_and_grad([&](const Params& p) {
      return cross_entropy(models::minigpt_apply(mc, p, {ids}, RngKey{5, uint64_t(s)}, true), labels);
    })(params);
    {
      Params updates = opt.update(grads, state, params);
      grads = Params{};
      params = optim::apply_updates(std::move(params), updates);  // in place
    }
    loss.item();
    if (s >= warmup) times.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  if (profiled) {
    prim::set_op_observer({});
    trace::stop();
  }
  return median(times);
}

double torch_step_seconds(const Config& c, int warmup, int steps, int threads, MatmulPrecision precision) {
  const std::string cmd = "/usr/bin/python3 " MT_SOURCE_DIR "/bench/torch_model_step.py minigpt " + std::to_string(c.B) +
                          " " + std::to_string(c.T) + " " + std::to_string(warmup) + " " + std::to_string(steps) + " " +
                          std::to_string(threads) + " " + matmul_precision_name(precision) + " " + std::to_string(c.V) +
                          "," + std::to_string(c.C) + "," + std::to_string(c.H) + "," + std::to_string(c.FF) + "," +
                          std::to_string(c.L);
  FILE* p = popen(cmd.c_str(), "r");
  double s = -1;
  if (p) {
    char line[4096];
    std::string out;
    while (fgets(line, sizeof line, p)) out += line;
    pclose(p);
    try {
      s = nlohmann::json::parse(out).at("step_s").get<double>();
    } catch (const std::exception&) {
      s = -1;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int warmup = quick ? 2 : 5, steps = quick ? 5 : 20;
  const int threads = omp_get_max_threads();
  const bool bf16_native = cpu::cpu_features().bf16_gemm_native;
  std::printf("%s\n", cpu::cpu_summary().c_str());
  if (!cpu::cpu_features().cap.empty())
    std::printf("(the cap applies to meshtrain only: PyTorch runs on the processor's own ISA)\n");
  const double peak_f32 = gemm_peak_gflops(DType::f32), peak_bf16 = bf16_native ? gemm_peak_gflops(DType::bf16) : 0;
  std::printf("GEMM peak (mt::matmul 2048^3, %d threads): f32 %.1f GFLOP/s, bf16 ", threads, peak_f32);
  if (bf16_native)
    std::printf("%.1f GFLOP/s\n\n", peak_bf16);
  else
    std::printf("n/a (bf16 %s; bf16 rows use the f32 peak for MFU)\n\n", cpu::bf16_gemm_mode().c_str());
  std::printf("%-6s %-26s %-5s %-10s %10s %10s %7s\n", "model", "shape", "prec", "engine", "s/step", "tokens/s", "MFU");
  const std::vector<Config> configs = {{"demo", 320, 128, 128, 4, 512, 4, 16}, {"wide", 8192, 256, 512, 8, 2048, 4, 8}};
  for (const Config& c : configs) {
    char shape[64];
    std::snprintf(shape, sizeof shape, "V%ld T%ld C%ld L%ld B%ld", long(c.V), long(c.T), long(c.C), long(c.L), long(c.B));
    const double flops = step_flops(c);
    for (MatmulPrecision precision : {MatmulPrecision::f32, MatmulPrecision::bf16}) {
      const char* prec = matmul_precision_name(precision);
      const double peak = precision == MatmulPrecision::bf16 && bf16_native ? peak_bf16 : peak_f32;
      const double ours = meshtrain_step_seconds(c, warmup, steps, precision);
      const double theirs = torch_step_seconds(c, warmup, steps, threads, precision);
      for (auto [engine, s] : {std::pair<const char*, double>{"meshtrain", ours}, {"pytorch", theirs}}) {
        if (s <= 0) {
          std::printf("%-6s %-26s %-5s %-10s %10s\n", c.name, shape, prec, engine, "failed");
          continue;
        }
        std::printf("%-6s %-26s %-5s %-10s %10.4f %10.0f %6.1f%%\n", c.name, shape, prec, engine, s,
                    double(c.B * c.T) / s, 100.0 * flops / s / 1e9 / peak);
      }
      std::printf("%-6s %-26s %-5s %-10s %9.2fx\n", c.name, shape, prec, "speedup", theirs / ours);
    }
  }
  // The profiler's cost: the same f32 steps with the --profile recorder on and off, alternated
  // three times each (run-to-run noise is of the same order), medians compared.
  std::printf("\nprofiler overhead (f32, recorder on vs off, median s/step of 3 alternated runs each)\n");
  for (const Config& c : configs) {
    std::vector<double> off, on;
    for (int r = 0; r < 3; ++r) {
      off.push_back(meshtrain_step_seconds(c, warmup, steps, MatmulPrecision::f32));
      on.push_back(meshtrain_step_seconds(c, warmup, steps, MatmulPrecision::f32, true));
    }
    std::printf("%-6s off %.4f   on %.4f   overhead %+.1f%%   (off %.4f..%.4f, on %.4f..%.4f)\n", c.name, median(off),
                median(on), 100.0 * (median(on) / median(off) - 1.0), *std::min_element(off.begin(), off.end()),
                *std::max_element(off.begin(), off.end()), *std::min_element(on.begin(), on.end()),
                *std::max_element(on.begin(), on.end()));
  }
  return 0;
}
