// Step time of a small GPT (forward, backward, AdamW) under each parallel layout, run with
// `mpirun -np N spmd_step_bench`: single device (every rank alone, OpenMP threads as set),
// data parallel, FSDP and tensor parallel over all ranks. Prints ms/step and tokens/s.
// Usage: mpirun -np 2 build/bench/spmd_step_bench [steps] [--layouts dp,fsdp,...] [--bucket-mb N]
//   [--grad-reduce-dtype f32|bf16]
// (--bucket-mb: the gradient all-reduce bucket; one larger than all gradients means no
// overlap with the backward pass: bench/multihost_overlap.sh compares the two over a slow link,
// and bf16 on the wire beside f32: dist::grad_reduce_dtype)
#include <chrono>
#include <cstdio>
#include <string>

#include "meshtrain/distributed/grad_reducer.h"
#include "meshtrain/distributed/mesh.h"
#include "meshtrain/distributed/spmd.h"
#include "tests/support/tiny_gpt.h"

using namespace mt;
using namespace mt::testing;

namespace {

Array random_ids(const TinyGptConfig& c, uint64_t seed) {
  return cast(mul(random_uniform(RngKey{seed, 0}, {c.batch, c.time}), double(c.vocab)), DType::i64);
}

double run(const TinyGptConfig& c, const std::string& layout, const dist::Mesh* mesh, int steps) {
  Params params = tiny_gpt_init(c, layout, mesh);
  optim::Transform opt = tiny_gpt_optimizer();
  Params state = opt.init(params);
  Array ids = random_ids(c, 1), labels = random_ids(c, 2);
  if (mesh && layout != "tp") {
    ids = dist::shard(ids, *mesh, dist::PartitionSpec{"data", ""}, "ids");
    labels = dist::shard(labels, *mesh, dist::PartitionSpec{"data", ""}, "labels");
  }
  double total = 0;
  for (int s = 0; s < steps + 1; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    auto [loss, grads] = value_and_grad([&](const Params& p) { return tiny_gpt_loss(c, p, ids, labels, uint64_t(s)); })(params);
    params = optim::apply_updates(params, opt.update(grads, state, params));
    dist::to_host(loss).item();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) total += dt;  // the first step warms caches and primitives
  }
  return total / steps;
}

}  // namespace

int main(int argc, char** argv) {
  return dist::run_guarded([&] {
    int steps = 5;
    std::string layouts = "single,dp,fsdp,tp";
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--layouts" && i + 1 < argc) layouts = argv[++i];
      else if (a == "--bucket-mb" && i + 1 < argc) dist::set_grad_bucket_bytes(size_t(std::stod(argv[++i]) * (1 << 20)));
      else if (a == "--grad-reduce-dtype" && i + 1 < argc) dist::set_grad_reduce_dtype(dtype_from_name(argv[++i]));
      else steps = std::stoi(a);
    }
    layouts = "," + layouts + ",";
    const int n = dist::world().size();
    TinyGptConfig c{.vocab = 4096, .width = 256, .heads = 8, .layers = 4, .batch = 8, .time = 128, .dropout = 0.1};
    if (dist::world().rank() == 0)
      std::printf("tiny GPT: vocab %ld, width %ld, %ld layers, batch %ld x %ld tokens, %d ranks\n", long(c.vocab),
                  long(c.width), long(c.layers), long(c.batch), long(c.time), n);
    struct Case {
      std::string layout, mesh;
    };
    std::vector<Case> cases{{"single", ""}, {"dp", "data=" + std::to_string(n)}, {"fsdp", "data=" + std::to_string(n)},
                            {"tp", "model=" + std::to_string(n)}};
    if (dist::world().rank() == 0)
      std::printf("gradient bucket %.1f MiB\n", double(dist::grad_bucket_bytes()) / (1 << 20));
    for (const Case& k : cases) {
      if (layouts.find("," + k.layout + ",") == std::string::npos) continue;
      dist::Mesh mesh = k.mesh.empty() ? dist::Mesh::single() : dist::Mesh::from_string(k.mesh);
      double sec = run(c, k.layout, k.mesh.empty() ? nullptr : &mesh, steps);
      // Every layout processes the same global batch per step (single: each rank alone).
      double tokens = double(c.batch * c.time);
      if (dist::world().rank() == 0)
        std::printf("%-7s %-12s %8.1f ms/step %9.0f tokens/s, gradient buckets %d (%d during backward)\n", k.layout.c_str(), k.mesh.empty() ? "(1 device)" : k.mesh.c_str(),
                    sec * 1e3, tokens / sec, dist::last_grad_reduction().buckets,
                    dist::last_grad_reduction().buckets_during_backward);
    }
    return 0;
  });
}
