// Serving throughput and latency of `meshtrain serve`'s engine behind its HTTP server,
// in-process on a free loopback port: for each concurrency level, that many clients send
// completion requests back to back (greedy, ignore_eos, a fixed number of new tokens), and
// the bench prints generated tokens/s and p50/p99 request latency, and the speed-up over one
// client at a time.
//
//   serve_bench [--quick] [--model small|gpt2|both]
//
// small: the default miniGPT of `meshtrain pretrain` (4 blocks, width 128, byte vocab);
// gpt2: GPT-2 small's shapes (124M parameters, 12 layers, width 768, vocab 50257). Weights
// are random (throughput does not depend on them).
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <thread>
#include <vector>

#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/models/causal_lm.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/models/minigpt.h"
#include "meshtrain/serve/http_server.h"

namespace {

using namespace mt;

struct Level {
  int clients;
  int requests_per_client;
};

struct Result {
  double tokens_per_s, p50_s, p99_s;
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

Result measure(int port, const Level& level, int new_tokens) {
  std::vector<std::vector<double>> latencies(size_t(level.clients));
  std::vector<int64_t> tokens(size_t(level.clients), 0);
  const std::string body = "{\"prompt\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], \"max_tokens\": " +
                           std::to_string(new_tokens) + ", \"temperature\": 0, \"ignore_eos\": true}";
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < level.clients; ++c)
    threads.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(600, 0);
      client.set_tcp_nodelay(true);
      for (int i = 0; i < level.requests_per_client; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        auto res = client.Post("/v1/completions", body, "application/json");
        latencies[size_t(c)].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        if (!res || res->status != 200) {
          std::cerr << "serve_bench: client " << c << " request " << i << " failed after "
                    << latencies[size_t(c)].back() << " s: " << (res ? res->body : httplib::to_string(res.error())) << "\n";
          std::exit(1);
        }
        tokens[size_t(c)] += nlohmann::json::parse(res->body)["usage"]["completion_tokens"].get<int64_t>();
      }
    });
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<double> all;
  int64_t total = 0;
  for (size_t c = 0; c < latencies.size(); ++c) all.insert(all.end(), latencies[c].begin(), latencies[c].end()), total += tokens[c];
  return {double(total) / wall, percentile(all, 0.5), percentile(all, 0.99)};
}

// The model alone: one decode step of b sequences (prompt 16 tokens), no HTTP, no engine.
void decode_steps(const models::CausalLm& lm) {
  serve::BatchDecoder d(lm);
  std::cout << "  decode step (model alone):";
  for (int64_t b : {1, 4, 16, 64}) {
    const int steps = 8;
    serve::PagedKvCache cache(b * (16 + steps + 16) / 16 + b, 16);
    std::vector<int64_t> seqs, tokens(size_t(b), 7);
    for (int64_t i = 0; i < b; ++i) {
      models::KvCache c;
      d.prefill({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, c);
      cache.store(i, c);
      seqs.push_back(i);
    }
    models::PagedKvStep first = cache.step(seqs);
    d.decode(first, tokens);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) {
      models::PagedKvStep step = cache.step(seqs);
      d.decode(step, tokens);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
    std::cout << std::fixed << std::setprecision(1) << "  b=" << b << " " << ms << " ms (" << double(b) * 1000 / ms
              << " tok/s)";
  }
  std::cout << "\n";
}

void bench_model(const std::string& name, const models::CausalLm& lm, int new_tokens, const std::vector<Level>& levels,
                 int64_t max_batch) {
  serve::EngineOptions eo;
  eo.max_batch = max_batch;
  eo.kv_cache_bytes = int64_t(4) << 30;
  serve::Engine engine(lm, eo);
  serve::ServedModel sm;
  sm.name = name;
  sm.max_model_len = engine.max_model_len();
  sm.max_prompt_tokens = sm.max_model_len - 1;
  sm.max_tokens_limit = sm.max_model_len - 1;
  serve::ServerOptions so;
  so.port = 0;
  serve::HttpServer server(engine, sm, so);
  const int port = server.bind();
  std::thread serving([&] { server.run(); });
  std::cout << "\n" << name << "\n";
  decode_steps(lm);
  measure(port, {1, 1}, 4);  // warm-up: oneDNN's kernels for these shapes
  std::cout << "  HTTP: prompt 16 tokens, " << new_tokens << " new tokens per request, max batch " << max_batch
            << "\n  clients  requests  tokens/s  p50 latency  p99 latency  vs 1 client\n";
  double sequential = 0;
  for (const Level& l : levels) {
    Result r = measure(port, l, new_tokens);
    if (l.clients == 1) sequential = r.tokens_per_s;
    std::cout << std::fixed << std::setprecision(1) << "  " << std::setw(7) << l.clients << "  " << std::setw(8)
              << l.clients * l.requests_per_client << "  " << std::setw(8) << r.tokens_per_s << "  " << std::setw(10)
              << std::setprecision(3) << r.p50_s << " s  " << std::setw(9) << r.p99_s << " s  " << std::setprecision(2)
              << std::setw(9) << (sequential > 0 ? r.tokens_per_s / sequential : 0.0) << "x\n";
  }
  server.stop();
  serving.join();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string which = "both";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--model") && i + 1 < argc) which = argv[++i];
  }
  std::cout << "serve_bench: cpu " << cpu::cpu_features().isa << ", " << std::thread::hardware_concurrency()
            << " hardware threads\n";
  const int reps = quick ? 1 : 2;
  if (which == "small" || which == "both") {
    models::MiniGptConfig c;
    c.vocab_size = 320, c.maxlen = 256, c.embed_dim = 128, c.num_heads = 4, c.feed_forward_dim = 512;
    c.num_transformer_blocks = 4;
    static Params p = models::minigpt_init(c, {1, 0});
    bench_model("small (miniGPT 0.9M)", models::minigpt_causal_lm(c, p), 64,
                {{1, 4 * reps}, {4, 4 * reps}, {16, 2 * reps}, {64, reps}}, 64);
  }
  if (which == "gpt2" || which == "both") {
    models::Gpt2Config c;  // GPT-2 small
    c.vocab_size = 50257, c.n_positions = 1024, c.n_embd = 768, c.n_layer = 12, c.n_head = 12;
    static Params p = models::gpt2_init(c, {1, 0});
    bench_model("GPT-2 124M", models::gpt2_causal_lm(c, p), 32, {{1, 2 * reps}, {4, reps}, {16, reps}, {64, 1}}, 64);
  }
  return 0;
}
