// `meshtrain serve`: an OpenAI-compatible HTTP server (completions, chat completions,
// streaming) over a decoder model, with continuous batching. Prints
// "meshtrain serve: listening on http://HOST:PORT ..." on stdout once it accepts requests,
// and stops cleanly on SIGINT / SIGTERM.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "apps/meshtrain/chat_setup.h"
#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/serve/chat_template/chat_template.h"
#include "meshtrain/serve/broadcast_runner.h"
#include "meshtrain/serve/http_server.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/train/checkpoint_model.h"

namespace mt::cli {
namespace {

struct ServeFlags {
  std::string model, adapter, tokenizer, served_model_name, chat_template;
  std::string host = "127.0.0.1";
  int port = 8000;
  int64_t max_batch = 16;
  int64_t kv_cache_mb = 512;
  int64_t max_queue = 256;
  int64_t max_prefill_tokens = 2048;
  int64_t max_model_len = 0;
  int64_t max_prompt_tokens = 0;
  int64_t max_body_bytes = int64_t(1) << 20;
  std::string api_key;
  bool allow_new_heads = false;
  std::string precision = "f32";
  std::string device = "auto";
  std::string mesh;
  int model_shards = 1;
};


std::string base_name(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::string name = std::filesystem::path(path).filename().string();
  return name.empty() ? path : name;
}

void run(const ServeFlags& f) {
  RunFlags rf;
  rf.mesh = f.mesh;
  rf.model_shards = f.model_shards;
  rf.device = f.device;
  rf.precision = f.precision;
  train::Deployer deployer = make_deployer(rf);
  MT_CHECK(deployer.mesh().axis_size("data") == 1, "[serve] every process must hold a shard of one model: use --model-shards ",
           dist::world().size(), " (or --mesh model=", dist::world().size(), "); data-parallel replicas are not supported");
  const bool tensor_parallel = dist::world().size() > 1;
  const bool main = deployer.is_main();
  const auto precision = precision_scope(f.precision);
  models::PretrainedOptions po;
  po.load_tokenizer = true;
  po.print_report = main;
  if (f.allow_new_heads) po.new_params = models::NewParams::all;
  models::PretrainedModel m = train::is_checkpoint_path(f.model)
                                  ? train::load_checkpoint_model(f.model, deployer.mesh(), po)
                                  : models::from_pretrained(f.model, po);
  apply_adapter(m, f.adapter, main);
  MT_CHECK(m.is_causal_lm(), "[serve] ", f.model, ": model_type '", m.model_type, "' is not a decoder (use ",
           models::model_types_text(models::ModelKind::decoder), ")");
  if (tensor_parallel) m.params = make_plan(deployer, m.params, m.param_roles(), rf).shard(m.params);
  // Serving keeps no master copy: under --precision bf16 the weights are bf16 (half the memory).
  m.params = precision_policy().cast_for_compute(m.params);

  serve::ServedModel served;
  served.name = f.served_model_name.empty() ? base_name(f.model) : f.served_model_name;
  served.tokenizer = f.tokenizer.empty() ? m.tokenizer : tokenizers::load_tokenizer(f.tokenizer);
  models::CausalLm lm = m.causal_lm();
  if (served.tokenizer) lm = models::restrict_vocab(lm, std::min(lm.vocab_size, served.tokenizer->vocab_size()));
  // SIGINT / SIGTERM (mpirun forwards them to every rank) end rank 0's loop, which then tells
  // the other ranks to stop following: they must not die first.
  train::arm_stop_request("stopping the server");
  serve::EngineOptions eo;
  eo.max_batch = f.max_batch;
  eo.kv_cache_bytes = f.kv_cache_mb << 20;
  eo.max_queue = f.max_queue;
  eo.max_prefill_tokens = f.max_prefill_tokens;
  eo.max_model_len = f.max_model_len;
  eo.precision = precision_policy().matmul;
  // The loop runs on this (the main) thread: under mpirun its model steps communicate, which
  // MPI allows the main thread alone. HTTP is served from other threads.
  eo.loop_on_caller = true;
  if (!main) {
    // Every step rank 0's engine takes, this rank takes too, on its shards.
    serve::follow_steps(lm, serve::kv_cache_size(eo));
    return;
  }
  load_chat_template(served, f.model, f.chat_template, "serve");

  std::unique_ptr<serve::SequenceRunner> runner;
  if (tensor_parallel) runner = std::make_unique<serve::BroadcastRunner>(lm, serve::kv_cache_size(eo));
  else runner = std::make_unique<serve::LocalRunner>(lm, serve::kv_cache_size(eo));
  serve::Engine engine(std::move(runner), eo);
  served.max_model_len = engine.max_model_len();
  served.max_prompt_tokens = f.max_prompt_tokens > 0 ? std::min(f.max_prompt_tokens, served.max_model_len - 1)
                                                     : served.max_model_len - 1;
  served.max_tokens_limit = served.max_model_len - 1;

  serve::ServerOptions so;
  so.host = f.host;
  so.port = f.port;
  so.api_key = f.api_key;
  so.max_body_bytes = f.max_body_bytes;
  serve::HttpServer server(engine, served, so);
  int port = -1;
  try {
    port = server.bind();
  } catch (const Error&) {
    engine.stop();
    engine.run();  // ends at once; tells the other ranks to stop following
    throw;
  }

  std::atomic<bool> serving{true};
  std::thread http([&] { server.run(); });
  std::thread watcher([&] {
    while (serving.load() && !train::stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server.stop();
    engine.stop();
  });
  const int64_t tokens = eo.kv_cache_bytes / engine.kv_bytes_per_token();
  std::cout << "meshtrain serve: listening on http://" << f.host << ":" << port << " (model " << served.name
            << ", context " << served.max_model_len << ", batch " << f.max_batch << ", KV cache " << f.kv_cache_mb
            << " MiB = " << tokens << " tokens, chat template " << (served.chat_template ? "the model's" : "plain")
            << (tensor_parallel ? ", tensor-parallel over " + std::to_string(dist::world().size()) + " processes" : "")
            << (f.api_key.empty() ? "" : ", API key required") << ")" << std::endl;
  engine.run();
  serving.store(false);
  watcher.join();
  http.join();
  std::cout << "meshtrain serve: stopped" << std::endl;
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "serve a decoder model over OpenAI's HTTP API (completions, chat, streaming) with continuous batching");
  cmd->add_option("--model", f->model, "model directory (config.json + safetensors), llama2.c .bin, or a meshtrain run/checkpoint directory")
      ->required();
  cmd->add_option("--served-model-name", f->served_model_name, "the model id clients name (default: the base name of --model)");
  cmd->add_option("--tokenizer", f->tokenizer, "tokenizer file or directory (default: the model directory's)");
  cmd->add_option("--chat-template", f->chat_template, "Jinja chat template file (default: the model directory's; none: a plain 'role: content' template)");
  cmd->add_option("--host", f->host, "address to listen on (127.0.0.1: this machine only)")->capture_default_str();
  cmd->add_option("--port", f->port, "TCP port (0: any free port, printed at start)")->capture_default_str()->check(integer_range(0, 65535));
  cmd->add_option("--max-batch", f->max_batch, "sequences decoded together at most")->capture_default_str()->check(positive());
  cmd->add_option("--kv-cache-mb", f->kv_cache_mb, "KV-cache budget: requests wait while their reservations (prompt + max_tokens) would pass it")
      ->capture_default_str()->check(positive());
  cmd->add_option("--max-queue", f->max_queue, "requests waiting for admission at most (more get 429)")->capture_default_str()->check(positive());
  cmd->add_option("--max-prefill-tokens", f->max_prefill_tokens,
                  "padded prompt positions prefilled in one forward pass (prompts admitted together share one; a "
                  "longer prompt runs alone)")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--max-model-len", f->max_model_len, "prompt + completion tokens at most (0: the model's positions, else 2048)")
      ->capture_default_str()->check(non_negative());
  cmd->add_option("--max-prompt-tokens", f->max_prompt_tokens, "tokens per prompt at most (0: max-model-len - 1)")
      ->capture_default_str()->check(non_negative());
  cmd->add_option("--max-body-bytes", f->max_body_bytes, "request body size limit (larger get 413)")->capture_default_str()->check(positive());
  cmd->add_option("--api-key", f->api_key, "require 'Authorization: Bearer KEY' on /v1/ routes");
  cmd->add_option("--model-shards", f->model_shards, "tensor-parallel shards of each weight: run under mpirun with this many processes")
      ->capture_default_str()->check(positive());
  cmd->add_option("--mesh", f->mesh, "device mesh, e.g. model=2 (its size must equal the number of processes)");
  add_allow_new_heads_flag(cmd, f->allow_new_heads);
  add_adapter_flag(cmd, f->adapter);
  add_precision_flag(cmd, f->precision);
  add_device_flag(cmd, f->device);
  cmd->callback([f] { run(*f); });
}

}  // namespace mt::cli
