// The meshtrain side of bench/compare_pytorch.py: training steps (forward, backward, AdamW)
// of one workload on random tokens, reported as one JSON line — median seconds per step,
// the AdamW update's share, model FLOPs per step, minor page faults per step after step 3, peak RSS — so the driver can
// put it beside the PyTorch twin run in its own process.
// Usage: model_step_bench WORKLOAD BATCH SEQ WARMUP STEPS [f32|tf32|bf16|bf16-matmul] [none|block|full] [cpu|cuda]
//        model_step_bench peak [cuda]  (the CPU line and the f32 / bf16 GEMM peaks, GFLOP/s; on the
//                                       GPU: f32, tf32 and bf16 peaks of 8192^3 products)
//   WORKLOAD: minigpt (the seed tutorial's 8-block config), minigpt4 (the 4 blocks the tutorial
//   trains), gpt2 (124M), bert (base, 2-class sequence classifier), llama7b (LLaMA-7B-shaped,
//   random init: the largest-model row, one GPU; llama:C,FF,L,H,V for other sizes); SEQ tokens
//   per example;
//   then --remat (what the backward pass recomputes instead of storing) and the device. On
//   the GPU a step ends when its kernels have finished, and peak device memory is reported.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/models/minigpt.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/train/gemm_peak.h"

namespace {

using namespace mt;
using json = nlohmann::json;

struct Workload {
  std::function<Array(const Params&, const RngKey&)> loss;
  Params params;
  double flops_per_step = 0;
};

// 6 FLOPs per weight per token plus attention (12·L·T·C per token), as PaLM counts them.
double transformer_flops(double matmul_weights, double layers, double T, double C, double tokens) {
  return 6.0 * matmul_weights * tokens + 12.0 * layers * T * C * tokens;
}

std::vector<int64_t> random_ids(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = int64_t(rng() % uint64_t(vocab));
  return v;
}

// A decoder language model from its config.json, trained on random tokens (B, T) below `vocab`;
// the caller fills in its FLOPs.
Workload decoder_workload(const json& config, int64_t vocab, int64_t B, int64_t T, Remat remat) {
  Workload w;
  auto model = std::make_shared<models::PretrainedModel>(models::init_model(config));
  model->config = model->config.with_remat(remat);
  w.params = std::move(model->params);
  model->params = Params{};
  Array ids = Array::from_vector(random_ids(size_t(B * T), vocab, 1), {B, T});
  Array labels = Array::from_vector(random_ids(size_t(B * T), vocab, 2), {B, T});
  w.loss = [model, ids, labels](const Params& p, const RngKey& key) {
    models::DecoderInputs in;
    in.input_ids = ids;
    return model->decoder_loss(p, in, labels, key, true);
  };
  return w;
}

Workload make_workload(const std::string& name, int64_t B, int64_t T, Remat remat) {
  Workload w;
  if (name == "minigpt" || name == "minigpt4") {
    auto mc = std::make_shared<models::MiniGptConfig>();
    mc->vocab_size = 50257, mc->maxlen = T, mc->embed_dim = 256, mc->num_heads = 8, mc->feed_forward_dim = 256;
    mc->num_transformer_blocks = name == "minigpt4" ? 4 : 8;
    mc->remat = remat;
    w.params = models::minigpt_init(*mc, RngKey{0, 0});
    auto model = std::make_shared<models::PretrainedModel>();
    model->model_type = "minigpt", model->config = *mc;
    Array ids = Array::from_vector(random_ids(size_t(B * T), mc->vocab_size, 1), {B, T});
    Array labels = Array::from_vector(random_ids(size_t(B * T), mc->vocab_size, 2), {B, T});
    w.loss = [model, ids, labels](const Params& p, const RngKey& key) {
      return model->decoder_loss(p, {.input_ids = ids}, labels, key, true);
    };
    const double C = 256, FF = 256, L = double(mc->num_transformer_blocks);
    w.flops_per_step = transformer_flops(L * (4 * C * C + 2 * C * FF) + 50257 * C, L, double(T), C, double(B * T));
    return w;
  }
  if (name == "llama7b" || name.rfind("llama:", 0) == 0) {
    // llama7b is the Redco paper's LLaMA-7B row (its Table 1), randomly initialized: 4096 wide,
    // an 11008-wide SwiGLU MLP, 32 layers, 32 heads, 32000 tokens, untied head.
    // llama:C,FF,L,H,V is any other size (a small one checks the workload on a CPU).
    std::vector<int64_t> d{4096, 11008, 32, 32, 32000};
    if (name != "llama7b") {
      std::stringstream dims(name.substr(6));
      std::string item;
      for (size_t i = 0; i < d.size() && std::getline(dims, item, ','); ++i) d[i] = std::stoll(item);
    }
    const int64_t C = d[0], FF = d[1], L = d[2], H = d[3], V = d[4];
    json config = {{"model_type", "llama"},      {"architectures", {"LlamaForCausalLM"}},
                   {"vocab_size", V},            {"hidden_size", C},
                   {"intermediate_size", FF},    {"num_hidden_layers", L},
                   {"num_attention_heads", H},   {"num_key_value_heads", H},
                   {"max_position_embeddings", std::max<int64_t>(2048, T)}};
    w = decoder_workload(config, V, B, T, remat);
    w.flops_per_step = transformer_flops(double(L) * (4.0 * C * C + 3.0 * C * FF) + double(V) * C, double(L), double(T),
                                         double(C), double(B * T));
    return w;
  }
  if (name == "gpt2") {
    json config = {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 50257},
                   {"n_positions", 1024}, {"n_embd", 768}, {"n_layer", 12}, {"n_head", 12}};
    w = decoder_workload(config, 50257, B, T, remat);
    const double C = 768, L = 12;
    w.flops_per_step = transformer_flops(L * 12 * C * C + 50257 * C, L, double(T), C, double(B * T));
    return w;
  }
  if (name == "bert") {
    json config = {{"model_type", "bert"}, {"architectures", {"BertForSequenceClassification"}}, {"vocab_size", 30522},
                   {"hidden_size", 768}, {"num_hidden_layers", 12}, {"num_attention_heads", 12},
                   {"intermediate_size", 3072}, {"num_labels", 2}};
    auto model = std::make_shared<models::PretrainedModel>(models::init_model(config));
    w.params = model->params;
    model->params = Params{};
    models::BertInputs in;
    in.input_ids = Array::from_vector(random_ids(size_t(B * T), 30522, 1), {B, T});
    in.attention_mask = Array::ones({B, T}, DType::i64);
    in.token_type_ids = Array::zeros({B, T}, DType::i64);
    Array labels = Array::from_vector(random_ids(size_t(B), 2, 2), {B});
    const models::BertConfig c = model->config.with_remat(remat).as<models::BertConfig>();
    w.loss = [c, in, labels](const Params& p, const RngKey& key) {
      return cross_entropy(models::bert_apply(c, p, in, key, true).logits, labels);
    };
    const double C = 768, L = 12;
    // Encoder weights plus the pooler; the classifier's 2 outputs are negligible.
    w.flops_per_step = transformer_flops(L * 12 * C * C + C * C, L, double(T), C, double(B * T));
    return w;
  }
  throw Error("[model_step_bench] unknown workload '" + name + "' (minigpt, minigpt4, gpt2, bert, llama7b, llama:C,FF,L,H,V)");
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

}  // namespace

// The GEMM peak of the GPU for a dtype and matmul precision (8192^3 products).
double gpu_gemm_gflops(DType dtype, MatmulPrecision precision, int reps) {
  MatmulPrecisionScope scope(precision);
  DeviceScope on_gpu(Device::cuda(0));
  return train::measure_gemm_gflops(dtype, 8192, reps, 1e9);
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "peak" && std::string(argv[2]) == "cuda") {
    json out = {{"gpu", cuda_runtime().describe(0)},
                {"gemm_f32_gflops", gpu_gemm_gflops(DType::f32, MatmulPrecision::f32, 3)},
                {"gemm_tf32_gflops", gpu_gemm_gflops(DType::f32, MatmulPrecision::tf32, 5)},
                {"gemm_bf16_gflops", gpu_gemm_gflops(DType::bf16, MatmulPrecision::f32, 10)}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "peak") {
    // Best of 5 2048^3 matmuls; bf16 only where the CPU multiplies bf16 natively.
    const bool bf16 = cpu::cpu_features().bf16_gemm_native;
    json out = {{"cpu", cpu::cpu_summary()},
                {"gemm_f32_gflops", train::measure_gemm_gflops(DType::f32, 2048, 5, 1e9)},
                {"gemm_bf16_gflops", bf16 ? json(train::measure_gemm_gflops(DType::bf16, 2048, 5, 1e9)) : json(nullptr)}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  if (argc < 6) {
    std::fprintf(stderr, "usage: model_step_bench WORKLOAD BATCH SEQ WARMUP STEPS [f32|tf32|bf16] [none|block|full] [cpu|cuda]\n");
    return 2;
  }
  try {
    const std::string name = argv[1];
    const int64_t B = std::stoll(argv[2]), T = std::stoll(argv[3]);
    const int warmup = std::stoi(argv[4]), steps = std::stoi(argv[5]);
    const std::string precision = argc > 6 ? argv[6] : "f32";
    const Remat remat = parse_remat(argc > 7 ? argv[7] : "none");
    const Device device = Device::parse(argc > 8 ? argv[8] : "cpu");
    // MT_ATTENTION=auto|composed|fused overrides the attention form (see AttentionKernel).
    if (const char* a = std::getenv("MT_ATTENTION")) set_attention_kernel(attention_kernel_from_name(a));
    set_default_device(device);
    // f32, tf32, bf16 (mixed precision: f32 master weights cast to bf16 once per step, bf16
    // activations) or bf16-matmul (f32 throughout, matmul operands rounded to bf16).
    PrecisionScope scope(precision_policy_from_name(precision));
    const PrecisionPolicy& policy = precision_policy();
    Workload w = make_workload(name, B, T, remat);
    optim::Transform opt = optim::adamw(optim::constant_schedule(1e-4), 0.9, 0.999, 1e-8, 0.01);
    Params params = w.params, state = opt.init(params);
    w.params = Params{};
    // MT_PROFILE_OPS=1: kernel seconds per primitive over the timed steps, on stderr (each
    // observed GPU kernel is timed to completion, so the step itself is slower).
    std::map<std::string, std::pair<double, int64_t>> op_time;
    bool timing_ops = false;
    const bool profile_ops = std::getenv("MT_PROFILE_OPS") != nullptr;
    if (profile_ops)
      prim::set_op_observer([&](const prim::OpEvent& e) {
        if (!timing_ops) return;
        std::string key = e.primitive.name();
        if (key == "matmul" || key == "dropout" || key == "add" || key == "transpose")
          for (const Array& x : e.inputs) key += " " + x.str();
        else if (e.output.defined())
          key += std::string(" -> ") + dtype_name(e.output.dtype());  // which kernel dtype ran
        auto& slot = op_time[key];
        slot.first += e.seconds;
        slot.second += 1;
      });
    std::vector<double> times, optimizer_times;
    long faults_before = 0;
    double loss_first = 0, loss_last = 0;
    // The allocator's peak bytes in use during the forward + backward and during the update.
    size_t peak_grad = 0, peak_update = 0;
    CachingAllocator& alloc = CachingAllocator::instance();
    for (int s = 0; s < warmup + steps; ++s) {
      if (s == std::max(warmup, 3)) faults_before = minor_faults();
      timing_ops = s >= warmup;
      const auto t0 = std::chrono::steady_clock::now();
      alloc.reset_peak();
      Array loss;
      Params grads;
      {
        // Cast once per step (nothing under f32) and handed to the tape, as the Trainer does.
        Params compute = policy.cast_for_compute(params);
        std::tie(loss, grads) = value_and_grad([&](const Params& p) {
          return cast(w.loss(policy.compute_view(p, std::move(compute)), RngKey{5, uint64_t(s)}), DType::f32);
        })(params);
      }
      const auto t1 = std::chrono::steady_clock::now();
      peak_grad = std::max(peak_grad, alloc.stats().peak_bytes_in_use);
      alloc.reset_peak();
      {
        // Moved in, as the Trainer does: Adam frees the gradients before its updates exist.
        Params updates = opt.update(std::move(grads), state, params);
        grads = Params{};
        params = optim::apply_updates(std::move(params), updates);  // in place
      }
      // The optimizer's time: on the CPU its whole run; on a GPU the host's time to enqueue it
      // (its kernels run behind the backward's).
      if (s >= warmup)
        optimizer_times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
      // Read after the update is enqueued, as torch_model_step.py reads loss.item() after
      // opt.step(): reading it first would hold the host until the backward has run.
      const double l = loss.item();
      synchronize(device);  // a GPU step ends when its kernels have run
      peak_update = std::max(peak_update, alloc.stats().peak_bytes_in_use);
      if (s == 0) loss_first = l;
      loss_last = l;
      if (s >= warmup) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (profile_ops) {
      std::vector<std::pair<double, std::string>> rows;
      double total = 0;
      for (const auto& [name, t] : op_time) {
        rows.emplace_back(t.first, name);
        total += t.first;
      }
      std::sort(rows.rbegin(), rows.rend());
      std::fprintf(stderr, "kernel time per step by primitive (%s, %d steps): total %.1f ms\n", name.c_str(), steps,
                   1e3 * total / steps);
      for (const auto& [t, op] : rows)
        std::fprintf(stderr, "  %-60s %8.2f ms  %5.1f %%  %6lld calls\n", op.c_str(), 1e3 * t / steps, 100 * t / total,
                     (long long)(op_time[op].second / steps));
      // What the table cannot see: kernels a VJP launches itself (flash_attention's backward),
      // the optimizer's and the host's time between kernels.
      double stepped = 0;
      for (double t : times) stepped += t;
      std::fprintf(stderr, "  step %.1f ms (profiled), of which outside the table (VJP-launched kernels, host): %.1f ms\n",
                   1e3 * stepped / steps, 1e3 * (stepped - total) / steps);
    }
    const int counted = warmup + steps - std::max(warmup, 3);
    std::sort(times.begin(), times.end());
    std::sort(optimizer_times.begin(), optimizer_times.end());
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    json out = {{"side", "meshtrain"},
                {"workload", name},
                {"precision", precision},
                {"remat", remat_name(remat)},
                {"step_s", times[times.size() / 2]},
                {"optimizer_s", optimizer_times[optimizer_times.size() / 2]},
                {"flops_per_step", w.flops_per_step},
                {"minor_faults_per_step", counted > 0 ? double(minor_faults() - faults_before) / counted : 0.0},
                {"peak_rss_mb", double(u.ru_maxrss) / 1024.0},
                {"peak_allocated_grad_mb", double(peak_grad) / (1 << 20)},
                {"peak_allocated_update_mb", double(peak_update) / (1 << 20)},
                {"allocator_reserved_mb", double(alloc.stats().bytes_reserved) / (1 << 20)},
                {"loss_first", loss_first},
                {"loss_last", loss_last},
                {"device", device.str()}};
    if (device.is_cuda()) out["peak_device_mb"] = double(cuda_runtime().memory_stats(device.index).peak_bytes_in_use) / (1 << 20);
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_step_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
