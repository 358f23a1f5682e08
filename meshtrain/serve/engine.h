#pragma once
// The continuous-batching engine behind `meshtrain serve`. One loop thread owns the model:
// each step it admits waiting requests (prefilling their prompts), then decodes one token
// for every running sequence together. Sequences join at the step after they arrive and
// leave the step they finish, so a long request never holds up a short one.
//
// Memory: every sequence reserves KV-cache room for its prompt and all of max_tokens when
// admitted, and admission waits while the reservations would pass the byte budget — the
// cache can never outgrow it. A request that could never fit is refused at once.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/serve/request_stream.h"
#include "meshtrain/serve/sequence_runner.h"

namespace mt::serve {

struct SamplingParams {
  int64_t max_tokens = 16;
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;         // 0: all tokens
  uint64_t seed = 0;         // choice i draws from (seed, step, i), as `meshtrain generate --seed`
  int64_t logprobs = -1;     // < 0: none; 0: the chosen token's; k > 0: also the k most likely
  bool ignore_eos = false;   // keep going past the model's end token
};

// One or more prompts, each with n independent choices: choice p·n + j is prompt p's j-th.
struct EngineRequest {
  std::vector<std::vector<int64_t>> prompts;
  int64_t n = 1;
  SamplingParams sampling;
  int64_t choices() const { return int64_t(prompts.size()) * n; }
};

struct EngineOptions {
  int64_t max_batch = 16;                   // sequences decoded together at most
  int64_t kv_cache_bytes = int64_t(512) << 20;
  int64_t max_queue = 256;                  // requests waiting for admission at most
  int64_t max_prefill_tokens = 2048;        // padded prompt positions per prefill pass (a longer prompt: alone)
  int64_t max_model_len = 0;                // prompt + generated tokens; 0: the model's bound
  MatmulPrecision precision = MatmulPrecision::f32;  // the loop thread's (the setting is per thread)
  // false: the engine starts its own loop thread. true: the caller runs the loop with run()
  // (MPI allows only the main thread to communicate, and under tensor parallelism the loop's
  // model steps communicate).
  bool loop_on_caller = false;
};

// The KV memory a runner for an engine with `options` keeps.
inline KvCacheSize kv_cache_size(const EngineOptions& options) {
  KvCacheSize size;
  size.budget_bytes = options.kv_cache_bytes, size.max_sequences = options.max_batch;
  return size;
}

// Why submit() refused a request; the HTTP layer maps each kind to a status code.
class AdmissionError : public Error {
 public:
  enum class Kind { invalid, too_large, queue_full, stopped };
  AdmissionError(Kind kind, const std::string& message) : Error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct EngineStats {
  int64_t waiting_requests = 0;
  int64_t running_sequences = 0;
  int64_t kv_used_bytes = 0;      // held by the running sequences' caches
  int64_t kv_reserved_bytes = 0;  // promised to the running sequences (prompt + max_tokens)
  int64_t kv_budget_bytes = 0;
  int64_t steps = 0;              // decode steps run
  int64_t prompt_tokens = 0;      // prefilled
  int64_t generated_tokens = 0;
  int64_t cancelled_sequences = 0;  // dropped because their client left or had its stop string
  std::vector<int64_t> batch_size_counts;  // [b]: decode steps that ran b sequences
};

class Engine {
 public:
  Engine(models::CausalLm lm, EngineOptions options);
  Engine(std::unique_ptr<SequenceRunner> runner, EngineOptions options);
  ~Engine();  // stops the loop; requests still open end with FinishReason::error
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; its events arrive on the returned stream. Throws AdmissionError.
  std::shared_ptr<RequestStream> submit(EngineRequest request);
  // Ends the loop: waiting and running requests finish with an error event.
  void stop();
  // With loop_on_caller: runs the loop on this thread until stop().
  void run();

  EngineStats stats() const;
  const EngineOptions& options() const { return options_; }
  int64_t max_model_len() const { return options_.max_model_len; }
  int64_t kv_bytes_per_token() const { return runner_->kv_bytes_per_token(); }
  const models::CausalLm& model() const { return runner_->model(); }

 private:
  struct Waiting {
    EngineRequest request;
    std::shared_ptr<RequestStream> stream;
    int64_t reserve_bytes;
  };
  struct Sequence {
    std::shared_ptr<RequestStream> stream;
    int64_t choice = 0;
    int64_t draw_row = 0;  // j of choice p·n + j: the row of the random draws
    SamplingParams sampling;
    RngKey key;
    int64_t id = -1;         // the runner's sequence (its KV cache)
    std::vector<int64_t> stops;
    int64_t budget = 0;      // new tokens allowed
    int64_t generated = 0;
    int64_t last_token = 0;
    int64_t reserve_bytes = 0;
  };

  // KV bytes a sequence reserves: its prompt and all of its new tokens.
  int64_t reservation(int64_t prompt_tokens, int64_t max_tokens) const {
    return (prompt_tokens + max_tokens) * runner_->kv_bytes_per_token();
  }
  void loop();
  std::vector<Waiting> take_admissible();
  // Prefills the admitted requests' prompts, several per forward pass, and starts their
  // sequences.
  void prefill(std::vector<Waiting>& admitted);
  // Starts the n sequences of prompt p of `w` (runner ids id .. id + n - 1, already prefilled
  // and forked) from the prompt's next-token logits.
  void start_sequences(Waiting& w, size_t p, int64_t id, const float* logits);
  void decode_step();
  // Chooses the next token of a sequence from its logits row and emits it; true when the
  // sequence has finished.
  bool emit_token(Sequence& s, const float* logits);
  void release(const Sequence& s);
  void fail_all(const std::string& message);

  std::unique_ptr<SequenceRunner> runner_;
  EngineOptions options_;
  int64_t next_id_ = 0;
  std::vector<Sequence> running_;  // the loop thread's alone

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Waiting> waiting_;
  bool stopping_ = false;
  int64_t reserved_bytes_ = 0;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace mt::serve
