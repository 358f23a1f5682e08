#include "meshtrain/serve/engine.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/models/generate.h"

namespace mt::serve {

namespace {

// The k most likely tokens of a row (ties: lower id first) with their log-probabilities.
std::vector<std::pair<int64_t, double>> top_logprobs(const float* row, int64_t v, int64_t k, double lse) {
  std::vector<int64_t> order(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), int64_t(0));
  k = std::min(k, v);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  std::vector<std::pair<int64_t, double>> out;
  for (int64_t i = 0; i < k; ++i) out.emplace_back(order[size_t(i)], double(row[order[size_t(i)]]) - lse);
  return out;
}

}  // namespace

Engine::Engine(models::CausalLm lm, EngineOptions options)
    : Engine(std::make_unique<LocalRunner>(std::move(lm), kv_cache_size(options)), options) {}

Engine::Engine(std::unique_ptr<SequenceRunner> runner, EngineOptions options)
    : runner_(std::move(runner)), options_(options) {
  const int64_t bound = runner_->model().max_positions;
  if (options_.max_model_len <= 0) options_.max_model_len = bound > 0 ? bound : 2048;
  MT_CHECK(bound <= 0 || options_.max_model_len <= bound, "[serve] max model length ", options_.max_model_len,
           " exceeds the model's ", bound, " positions");
  MT_CHECK(options_.max_batch >= 1, "[serve] max batch must be >= 1, got ", options_.max_batch);
  MT_CHECK(options_.max_queue >= 1, "[serve] max queue must be >= 1, got ", options_.max_queue);
  MT_CHECK(options_.kv_cache_bytes >= runner_->kv_bytes_per_token(), "[serve] a KV cache of ",
           options_.kv_cache_bytes, " bytes holds not even one token (", runner_->kv_bytes_per_token(),
           " bytes each)");
  stats_.kv_budget_bytes = options_.kv_cache_bytes;
  stats_.batch_size_counts.assign(size_t(options_.max_batch + 1), 0);
  if (!options_.loop_on_caller) thread_ = std::thread([this] { loop(); });
}

void Engine::run() {
  MT_CHECK(options_.loop_on_caller, "[serve] Engine::run is for an engine made with loop_on_caller");
  loop();
}

Engine::~Engine() {
  stop();
  if (thread_.joinable()) thread_.join();
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
}

std::shared_ptr<RequestStream> Engine::submit(EngineRequest r) {
  using Kind = AdmissionError::Kind;
  const int64_t v = runner_->vocab_size();
  const SamplingParams& s = r.sampling;
  auto invalid = [](const std::string& m) { return AdmissionError(Kind::invalid, m); };
  if (r.prompts.empty()) throw invalid("no prompt");
  if (r.n < 1) throw invalid(detail::concat("n must be >= 1, got ", r.n));
  if (r.choices() > options_.max_batch)
    throw invalid(detail::concat(r.choices(), " choices (prompts x n) exceed the server's batch of ",
                                 options_.max_batch, " sequences (--max-batch)"));
  if (s.max_tokens < 1) throw invalid(detail::concat("max_tokens must be >= 1, got ", s.max_tokens));
  if (!(s.temperature >= 0) || !std::isfinite(s.temperature))
    throw invalid(detail::concat("temperature must be >= 0, got ", s.temperature));
  if (!(s.top_p > 0 && s.top_p <= 1)) throw invalid(detail::concat("top_p must be in (0, 1], got ", s.top_p));
  if (s.top_k < 0) throw invalid(detail::concat("top_k must be >= 0, got ", s.top_k));
  int64_t reserve = 0, prompt_tokens = 0;
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    const int64_t len = int64_t(r.prompts[p].size());
    if (len == 0) throw invalid(detail::concat("prompt ", p, " is empty"));
    for (int64_t t : r.prompts[p])
      if (t < 0 || t >= v)
        throw invalid(detail::concat("prompt ", p, " has token ", t, " outside the vocabulary of ", v));
    if (len + s.max_tokens > options_.max_model_len)
      throw AdmissionError(Kind::too_large,
                           detail::concat("this model's maximum context length is ", options_.max_model_len,
                                          " tokens, but ", len + s.max_tokens, " were requested (", len,
                                          " in the prompt, ", s.max_tokens, " for the completion)"));
    reserve += r.n * reservation(len, s.max_tokens);
    prompt_tokens += len;
  }
  if (reserve > options_.kv_cache_bytes)
    throw AdmissionError(Kind::too_large,
                         detail::concat("the request needs ", reserve, " bytes of KV cache, more than the server's ",
                                        options_.kv_cache_bytes, " (--kv-cache-mb)"));
  auto stream = std::make_shared<RequestStream>(r.choices(), prompt_tokens);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw AdmissionError(Kind::stopped, "the server is shutting down");
    if (int64_t(waiting_.size()) >= options_.max_queue)
      throw AdmissionError(Kind::queue_full, detail::concat("the server is busy: ", waiting_.size(),
                                                            " requests are waiting; retry later"));
    waiting_.push_back({std::move(r), stream, reserve});
    stats_.waiting_requests = int64_t(waiting_.size());
  }
  wake_.notify_all();
  return stream;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::vector<Engine::Waiting> Engine::take_admissible() {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [&] { return stopping_ || !running_.empty() || !waiting_.empty(); });
  std::vector<Waiting> admitted;
  if (stopping_) return admitted;
  int64_t slots = options_.max_batch - int64_t(running_.size());
  // First come, first served: a request that does not fit yet blocks those behind it, so a
  // large one is never starved by a stream of small ones.
  while (!waiting_.empty()) {
    Waiting& w = waiting_.front();
    if (w.stream->cancelled()) {
      for (int64_t c = 0; c < w.request.choices(); ++c) w.stream->push(finish_event(c, FinishReason::cancelled));
      waiting_.pop_front();
      continue;
    }
    if (w.request.choices() > slots || reserved_bytes_ + w.reserve_bytes > options_.kv_cache_bytes) break;
    slots -= w.request.choices();
    reserved_bytes_ += w.reserve_bytes;
    admitted.push_back(std::move(w));
    waiting_.pop_front();
  }
  stats_.waiting_requests = int64_t(waiting_.size());
  stats_.kv_reserved_bytes = reserved_bytes_;
  return admitted;
}

void Engine::loop() {
  autodiff::NoGradGuard no_grad;
  MatmulPrecisionScope precision(options_.precision);
  for (;;) {
    std::vector<Waiting> admitted = take_admissible();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) break;
    }
    try {
      // Sequences whose client left (or found its stop string) free their room first.
      for (size_t i = 0; i < running_.size();) {
        if (running_[i].stream->cancelled(running_[i].choice)) {
          running_[i].stream->push(finish_event(running_[i].choice, FinishReason::cancelled));
          release(running_[i]);
          running_.erase(running_.begin() + int64_t(i));
          std::lock_guard<std::mutex> lock(mutex_);
          ++stats_.cancelled_sequences;
        } else {
          ++i;
        }
      }
      if (!admitted.empty()) prefill(admitted);
      if (!running_.empty()) decode_step();
    } catch (const std::exception& e) {
      // A failed step fails the sequences in it, not the server.
      fail_all(e.what());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.running_sequences = int64_t(running_.size());
    stats_.kv_used_bytes = runner_->cache_bytes();
  }
  fail_all("the server is shutting down");
  runner_->shutdown();
  std::lock_guard<std::mutex> lock(mutex_);
  for (Waiting& w : waiting_)
    for (int64_t c = 0; c < w.request.choices(); ++c)
      w.stream->push(finish_event(c, FinishReason::error, "the server is shutting down"));
  waiting_.clear();
}

void Engine::prefill(std::vector<Waiting>& admitted) {
  struct Prompt {
    Waiting* w;
    size_t p;
    int64_t id;  // of its first choice
  };
  std::vector<Prompt> all;
  for (Waiting& w : admitted)
    for (size_t p = 0; p < w.request.prompts.size(); ++p) {
      all.push_back({&w, p, next_id_});
      next_id_ += w.request.n;
    }
  const int64_t v = runner_->vocab_size();
  // Consecutive prompts while their padded size (count x longest) stays within the bound.
  for (size_t begin = 0, end = 0; begin < all.size(); begin = end) {
    int64_t longest = 0;
    for (end = begin; end < all.size(); ++end) {
      const int64_t len = std::max(longest, int64_t(all[end].w->request.prompts[all[end].p].size()));
      if (end > begin && len * int64_t(end - begin + 1) > options_.max_prefill_tokens) break;
      longest = len;
    }
    std::vector<int64_t> ids;
    std::vector<std::vector<int64_t>> prompts;
    for (size_t i = begin; i < end; ++i) {
      ids.push_back(all[i].id);
      prompts.push_back(all[i].w->request.prompts[all[i].p]);
    }
    std::vector<float> logits;
    try {
      logits = runner_->prefill(ids, prompts);
      for (size_t i = begin; i < end; ++i)
        for (int64_t j = 1; j < all[i].w->request.n; ++j) runner_->fork(all[i].id, all[i].id + j);
    } catch (const std::exception& e) {
      for (size_t i = begin; i < end; ++i) {
        Waiting& w = *all[i].w;
        const int64_t n = w.request.n, first = int64_t(all[i].p) * n;
        const int64_t reserve_each = reservation(int64_t(prompts[i - begin].size()), w.request.sampling.max_tokens);
        for (int64_t j = 0; j < n; ++j) {
          w.stream->push(finish_event(first + j, FinishReason::error, e.what()));
          Sequence failed;
          failed.id = all[i].id + j;
          failed.reserve_bytes = reserve_each;
          release(failed);
        }
      }
      continue;
    }
    for (size_t i = begin; i < end; ++i)
      start_sequences(*all[i].w, all[i].p, all[i].id, logits.data() + (i - begin) * size_t(v));
  }
}

void Engine::start_sequences(Waiting& w, size_t p, int64_t id, const float* logits) {
  const std::vector<int64_t>& prompt = w.request.prompts[p];
  const int64_t n = w.request.n, first = int64_t(p) * n;
  const SamplingParams& sp = w.request.sampling;
  const int64_t reserve_each = reservation(int64_t(prompt.size()), sp.max_tokens);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.prompt_tokens += int64_t(prompt.size());
  }
  for (int64_t j = 0; j < n; ++j) {
    Sequence s;
    s.stream = w.stream;
    s.choice = first + j;
    s.draw_row = j;
    s.sampling = sp;
    s.key = RngKey{sp.seed, 0x67656e};  // generate()'s stream of the seed: the same draws
    s.id = id + j;
    if (!sp.ignore_eos) s.stops = runner_->model().stop_tokens;
    s.budget = sp.max_tokens;
    s.reserve_bytes = reserve_each;
    if (s.stream->cancelled(s.choice)) {
      s.stream->push(finish_event(s.choice, FinishReason::cancelled));
      release(s);
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.cancelled_sequences;
      continue;
    }
    bool done = false;
    try {
      done = emit_token(s, logits);
    } catch (const std::exception& e) {
      // This choice fails; the prompt's other choices and the other prompts go on.
      s.stream->push(finish_event(s.choice, FinishReason::error, e.what()));
      done = true;
    }
    if (done) {
      release(s);
      continue;
    }
    running_.push_back(std::move(s));
  }
}

void Engine::decode_step() {
  std::vector<int64_t> ids, tokens;
  for (const Sequence& s : running_) ids.push_back(s.id), tokens.push_back(s.last_token);
  const std::vector<float> logits = runner_->decode(ids, tokens);
  const int64_t v = runner_->vocab_size(), b = int64_t(running_.size());
  std::vector<Sequence> still;
  still.reserve(running_.size());
  for (int64_t i = 0; i < b; ++i) {
    Sequence& s = running_[size_t(i)];
    if (emit_token(s, logits.data() + i * v)) release(s);
    else still.push_back(std::move(s));
  }
  running_ = std::move(still);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.steps;
  ++stats_.batch_size_counts[size_t(std::min<int64_t>(b, options_.max_batch))];
}

bool Engine::emit_token(Sequence& s, const float* row) {
  const int64_t v = runner_->vocab_size();
  const double lse = models::log_sum_exp(row, v);
  models::GenerationConfig g;
  g.temperature = s.sampling.temperature;
  g.top_k = s.sampling.top_k;
  g.top_p = s.sampling.top_p;
  const double u = uniform_at(s.key.fold_in(uint64_t(s.generated)).fold_in(uint64_t(s.draw_row)), 0);
  const int64_t tok = models::choose_token(std::span<const float>(row, size_t(v)), g, u);
  TokenEvent e;
  e.choice = s.choice;
  e.token = tok;
  e.logprob = double(row[tok]) - lse;
  if (s.sampling.logprobs > 0) e.top_logprobs = top_logprobs(row, v, s.sampling.logprobs, lse);
  e.is_stop_token = std::find(s.stops.begin(), s.stops.end(), tok) != s.stops.end();
  ++s.generated;
  s.last_token = tok;
  if (e.is_stop_token) e.finish = FinishReason::stop;
  else if (s.generated >= s.budget) e.finish = FinishReason::length;
  const bool done = e.finish != FinishReason::none;
  s.stream->push(std::move(e));
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.generated_tokens;
  return done;
}

void Engine::release(const Sequence& s) {
  if (s.id >= 0) runner_->drop(s.id);
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_bytes_ -= s.reserve_bytes;
  stats_.kv_reserved_bytes = reserved_bytes_;
  wake_.notify_all();
}

void Engine::fail_all(const std::string& message) {
  for (Sequence& s : running_) {
    s.stream->push(finish_event(s.choice, FinishReason::error, message));
    release(s);
  }
  running_.clear();
}

}  // namespace mt::serve
