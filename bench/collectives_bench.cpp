// Bandwidth of the communicator's collectives over MPI, 1 KiB to 64 MiB, next to the same
// MPI call made directly on the communication thread: what the queue, the handles and the
// communication thread cost on top of MPI.
// Usage: mpirun -np 2 collectives_bench [--quick]   (--quick stops at 4 MiB)
// Columns: size = all_reduce buffer, all_gather output, reduce_scatter input (f32);
// algbw = size / time; busbw = algbw * 2(n-1)/n for all_reduce, * (n-1)/n otherwise
// (the per-link traffic of ring algorithms, comparable across rank counts). "engine vs mpi" can
// exceed 100%: the engine cuts all_reduce into 4 MiB MPI calls, which beats one large call.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "meshtrain/distributed/communicator.h"
#include "meshtrain/distributed/mpi_runtime.h"

namespace {

using mt::DType;
using mt::dist::Communicator;
using mt::dist::ReduceOp;
using clock_type = std::chrono::steady_clock;

enum class Kind { all_reduce, all_reduce_bf16, all_gather, reduce_scatter };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_reduce: return "all_reduce";
    case Kind::all_reduce_bf16: return "all_reduce bf16";
    case Kind::all_gather: return "all_gather";
    case Kind::reduce_scatter: return "reduce_scatter";
  }
  return "?";
}

// Same on every rank, so the loops match: enough repetitions for ~0.1 s at a few GB/s.
int iterations(int64_t bytes) { return int(std::clamp<int64_t>((int64_t(256) << 20) / bytes, 5, 400)); }

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Slowest rank's time per collective, best of three rounds.
double time_engine(Communicator& w, Kind kind, int64_t bytes, std::vector<float>& a, std::vector<float>& b) {
  const int n = w.size();
  const int64_t elems = bytes / 4;
  const int iters = iterations(bytes);
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    w.barrier();
    const auto t0 = clock_type::now();
    for (int i = 0; i < iters; ++i) {
      switch (kind) {
        case Kind::all_reduce: w.all_reduce(a.data(), elems, DType::f32, ReduceOp::sum); break;
        case Kind::all_reduce_bf16: w.all_reduce(a.data(), elems * 2, DType::bf16, ReduceOp::sum); break;
        case Kind::all_gather: w.all_gather(a.data(), b.data(), elems / n, DType::f32); break;
        case Kind::reduce_scatter: w.reduce_scatter(a.data(), b.data(), elems / n, DType::f32, ReduceOp::sum); break;
      }
    }
    int64_t ns = int64_t(seconds_since(t0) * 1e9 / iters);
    w.all_reduce(&ns, 1, DType::i64, ReduceOp::max);
    best = std::min(best, double(ns) * 1e-9);
  }
  return best;
}

// The same collective called directly on the communication thread (no queue, no handle).
double time_raw_mpi(Kind kind, int64_t bytes, std::vector<float>& a, std::vector<float>& b, int n) {
  const int count = int(bytes / 4);
  const int iters = iterations(bytes);
  double best = 1e30;
  mt::dist::internal::MpiRuntime::instance().run("collectives_bench raw MPI loop", [&] {
    for (int round = 0; round < 3; ++round) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = clock_type::now();
      for (int i = 0; i < iters; ++i) {
        switch (kind) {
          case Kind::all_reduce:
            MPI_Allreduce(MPI_IN_PLACE, a.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
          case Kind::all_gather:
            MPI_Allgather(a.data(), count / n, MPI_FLOAT, b.data(), count / n, MPI_FLOAT, MPI_COMM_WORLD);
            break;
          case Kind::reduce_scatter:
            MPI_Reduce_scatter_block(a.data(), b.data(), count / n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
          case Kind::all_reduce_bf16: break;
        }
      }
      double t = seconds_since(t0) / iters;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      best = std::min(best, t);
    }
  });
  return best;
}

std::string format_size(int64_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  Communicator& w = mt::dist::world();
  const int n = w.size();
  const bool root = w.rank() == 0;
  if (n < 2) {
    if (root) std::printf("collectives_bench: run under mpirun -np 2 (or more); one rank has nothing to measure\n");
    return 1;
  }
  const int64_t max_bytes = quick ? (int64_t(4) << 20) : (int64_t(64) << 20);
  // Zeros stay zeros under repeated sums (no overflow to inf over hundreds of iterations).
  std::vector<float> a(size_t(max_bytes / 4), 0.0f), b(size_t(max_bytes / 4), 0.0f);
  if (root) {
    std::printf("collectives over MPI, %d ranks, f32 (bf16 row: same bytes, reduced in f32)\n", n);
    std::printf("%-16s %8s %6s %10s %9s %9s %11s %8s\n", "collective", "size", "iters", "time_us", "algbw", "busbw",
                "mpi_algbw", "engine");
    std::printf("%-16s %8s %6s %10s %9s %9s %11s %8s\n", "", "", "", "", "GB/s", "GB/s", "GB/s", "vs mpi");
  }
  for (Kind kind : {Kind::all_reduce, Kind::all_reduce_bf16, Kind::all_gather, Kind::reduce_scatter}) {
    for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
      const double t = time_engine(w, kind, bytes, a, b);
      const double raw = kind == Kind::all_reduce_bf16 ? 0 : time_raw_mpi(kind, bytes, a, b, n);
      const double algbw = double(bytes) / t * 1e-9;
      const double factor = kind == Kind::all_reduce || kind == Kind::all_reduce_bf16 ? 2.0 * (n - 1) / n
                                                                                      : double(n - 1) / n;
      if (!root) continue;
      if (raw > 0)
        std::printf("%-16s %8s %6d %10.1f %9.3f %9.3f %11.3f %7.0f%%\n", kind_name(kind), format_size(bytes).c_str(),
                    iterations(bytes), t * 1e6, algbw, algbw * factor, double(bytes) / raw * 1e-9, 100.0 * raw / t);
      else
        std::printf("%-16s %8s %6d %10.1f %9.3f %9.3f %11s %8s\n", kind_name(kind), format_size(bytes).c_str(),
                    iterations(bytes), t * 1e6, algbw, algbw * factor, "-", "-");
      std::fflush(stdout);
    }
  }
  return 0;
}
