// GRPO's rollouts against serving: the same model, prompts and lengths sampled (a) by the
// rollout path (posttrain::sample_completions: the serving engine in-process, G choices per
// prompt) and (b) by `meshtrain serve` over HTTP (one client per prompt asking n = G), as
// generated tokens per second; then (c) one whole GRPO step (rollout, scoring, reference
// log-probabilities, forward + backward, AdamW) and the share of it spent generating.
//
//   grpo_rollout_bench [--model small|gpt2] [--prompts P] [--generations G] [--new-tokens N]
//                      [--device auto|cpu|cuda]
//
// small: `meshtrain pretrain`'s default GPT-2 (0.84M parameters, byte vocabulary); gpt2:
// GPT-2 small's shapes (124M) with GPT-2's tokenizer. Random weights, completions run to N
// tokens (no stop token).
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <thread>

#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/core/device.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/posttrain/grpo_rollout.h"
#include "meshtrain/posttrain/sampling.h"
#include "meshtrain/serve/http_server.h"
#include "meshtrain/tokenizers/byte_tokenizer.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/train/trainer.h"

namespace {

using namespace mt;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<std::vector<int64_t>> make_prompts(int64_t p, int64_t vocab) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < p; ++i) {
    std::vector<int64_t> ids;
    for (int64_t t = 0; t < 16; ++t) ids.push_back((i * 31 + t * 7 + 1) % (vocab - 1) + 1);
    out.push_back(ids);
  }
  return out;
}

// (b): one HTTP client per prompt, each asking n completions of exactly `new_tokens`.
double serve_tokens_per_s(const models::PretrainedModel& m, const std::vector<std::vector<int64_t>>& prompts, int64_t g,
                          int64_t new_tokens) {
  serve::EngineOptions eo;
  eo.max_batch = int64_t(prompts.size()) * g;
  eo.kv_cache_bytes = int64_t(4) << 30;
  serve::Engine engine(m.causal_lm(), eo);
  serve::ServedModel sm;
  sm.name = "bench";
  sm.max_model_len = engine.max_model_len();
  sm.max_prompt_tokens = sm.max_model_len - 1;
  sm.max_tokens_limit = sm.max_model_len - 1;
  serve::ServerOptions so;
  so.port = 0;
  serve::HttpServer server(engine, sm, so);
  const int port = server.bind();
  std::thread serving([&] { server.run(); });
  auto round = [&] {
    std::vector<std::thread> clients;
    std::vector<int64_t> tokens(prompts.size(), 0);
    const auto t0 = Clock::now();
    for (size_t c = 0; c < prompts.size(); ++c)
      clients.emplace_back([&, c] {
        httplib::Client client("127.0.0.1", port);
        client.set_read_timeout(600, 0);
        const nlohmann::json body = {{"prompt", prompts[c]}, {"n", g}, {"max_tokens", new_tokens},
                                     {"temperature", 1.0}, {"ignore_eos", true}, {"seed", int(c)}};
        auto res = client.Post("/v1/completions", body.dump(), "application/json");
        if (!res || res->status != 200) {
          std::cerr << "grpo_rollout_bench: serve request failed: " << (res ? res->body : httplib::to_string(res.error())) << "\n";
          std::exit(1);
        }
        tokens[c] = nlohmann::json::parse(res->body)["usage"]["completion_tokens"].get<int64_t>();
      });
    for (auto& t : clients) t.join();
    const double s = seconds_since(t0);
    int64_t total = 0;
    for (int64_t t : tokens) total += t;
    return double(total) / s;
  };
  round();  // warm-up
  const double r = std::max(round(), round());
  server.stop();
  serving.join();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "small", device = "cpu";
  int64_t p = 8, g = 8, n = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) which = argv[i + 1];
    else if (!std::strcmp(argv[i], "--prompts")) p = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--generations")) g = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--new-tokens")) n = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--device")) device = argv[i + 1];
  }
  // The Deployer makes `device` the default: the model's weights are made there.
  train::Deployer deployer({.seed = 1, .workdir = (std::filesystem::temp_directory_path() / "mt_grpo_bench").string(),
                            .verbose = false, .device = device});
  // The packed data on the GPU machine (scripts/gpu_pack.sh), else the build's.
  const char* data_env = std::getenv("MT_DATA_DIR");
  const std::string data_dir = data_env && *data_env ? data_env : MT_DATA_DIR;
  nlohmann::json config = models::model_spec("gpt2").small_config(320, 128, 256);
  if (which == "gpt2")
    config = {{"model_type", "gpt2"}, {"vocab_size", 50257}, {"n_positions", 1024}, {"n_embd", 768}, {"n_layer", 12}, {"n_head", 12}};
  auto model = std::make_shared<models::PretrainedModel>(models::init_model(config));
  const int64_t vocab = model->causal_lm().vocab_size;
  std::cout << "grpo_rollout_bench: cpu " << cpu::cpu_features().isa << ", " << std::thread::hardware_concurrency()
            << " hardware threads, device " << current_device().str() << "; " << which << " (" << model->params.total_elements() << " parameters), " << p
            << " prompts of 16 tokens x " << g << " completions of " << n << " tokens\n";
  // The tokenizer step (c) decodes with: bytes for the small model, GPT-2's for GPT-2; every
  // path samples from its ids only.
  const std::string dir = (std::filesystem::temp_directory_path() / "mt_grpo_bench_tok").string();
  std::shared_ptr<tokenizers::Tokenizer> tok = which == "gpt2"
                                                   ? tokenizers::load_tokenizer(data_dir + "/models/hf-tiny-gpt2")
                                                   : tokenizers::make_byte_tokenizer(dir);
  const auto prompts = make_prompts(p, std::min<int64_t>(vocab, tok->vocab_size()));

  posttrain::SamplingOptions so;
  so.n = g, so.max_new_tokens = n, so.temperature = 1.0, so.max_batch = p * g, so.vocab_limit = tok->vocab_size();
  posttrain::sample_completions(*model, model->params, prompts, so);  // warm-up
  double rollout = 0;
  for (int r = 0; r < 2; ++r) {
    so.seed = uint64_t(r + 1);
    const posttrain::SampledCompletions c = posttrain::sample_completions(*model, model->params, prompts, so);
    rollout = std::max(rollout, double(c.generated_tokens) / c.seconds);
  }
  const double serve = serve_tokens_per_s(*model, prompts, g, n);
  std::cout << std::fixed << std::setprecision(0) << "  rollout (sample_completions): " << rollout
            << " tokens/s\n  meshtrain serve over HTTP:     " << serve << " tokens/s  (rollout / serve = " << std::setprecision(2)
            << rollout / serve << ")\n";

  // (c) One GRPO step on those prompts: rollout + scoring + reference log-probs + update.
  std::vector<data::Example> rows;
  for (const auto& ids : prompts) rows.push_back(posttrain::prompt_example("bench", ids, {{"answer", std::string("7")}}));
  auto indexed = posttrain::with_prompt_indices(data::make_dataset(rows));
  posttrain::GrpoOptions go;
  go.num_generations = g, go.max_completion_length = n, go.temperature = 1.0, go.beta = 0.04;
  posttrain::GrpoReference ref;
  ref.kind = posttrain::GrpoReference::Kind::frozen_copy;
  ref.frozen = model->params;
  auto rollout_step = std::make_shared<posttrain::GrpoRollout>(model, indexed, posttrain::parse_rewards("exact_match:answer"), go,
                                                               deployer, tok, std::vector<int64_t>{}, ref);
  train::Trainer trainer(deployer, posttrain::prompt_index_collate(), posttrain::grpo_loss_fn(model, go), model->params,
                         optim::adamw(optim::constant_schedule(1e-5)));
  trainer.set_rollout([rollout_step](const Params& q, const std::vector<train::Batch>& m, int64_t s, const RngKey& k) {
    return (*rollout_step)(q, m, s, k);
  });
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < p; ++i) idx.push_back(i);
  const train::Batch batch{{"index", Array::from_vector(idx, {p})}};
  trainer.train({batch});  // warm-up
  double step = 1e30, gen = 0;
  for (int r = 0; r < 2; ++r) {
    const auto t0 = Clock::now();
    trainer.train({batch});
    const double s = seconds_since(t0);
    if (s < step) step = s, gen = trainer.last_step_metrics().at("rollout_seconds");
  }
  std::cout << std::setprecision(3) << "  one GRPO step: " << step << " s, of which generating " << gen << " s ("
            << std::setprecision(0) << 100.0 * gen / step << " %)\n";
  return 0;
}
