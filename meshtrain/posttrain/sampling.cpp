#include "meshtrain/posttrain/sampling.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/posttrain/rank0_share.h"
#include "meshtrain/serve/batch_decoder.h"
#include "meshtrain/serve/broadcast_runner.h"
#include "meshtrain/serve/engine.h"

namespace mt::posttrain {

namespace {

// Rank 0's completions (or its failure) to every rank: [choices, microseconds, then per
// choice: stopped, length, tokens...].
void share(SampledCompletions& c, std::string& failure) {
  std::vector<int64_t> words;
  if (dist::world().rank() == 0 && failure.empty()) {
    words.push_back(int64_t(c.tokens.size()));
    words.push_back(int64_t(c.seconds * 1e6));
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      words.push_back(c.stopped[i] ? 1 : 0);
      words.push_back(int64_t(c.tokens[i].size()));
      words.insert(words.end(), c.tokens[i].begin(), c.tokens[i].end());
    }
  }
  share_from_rank0(words, failure);
  if (dist::world().rank() == 0 || !failure.empty()) return;
  c = SampledCompletions{};
  size_t at = 0;
  const int64_t choices = words[at++];
  c.seconds = double(words[at++]) * 1e-6;
  for (int64_t i = 0; i < choices; ++i) {
    c.stopped.push_back(words[at++] != 0);
    const int64_t len = words[at++];
    c.tokens.emplace_back(words.begin() + int64_t(at), words.begin() + int64_t(at) + len);
    at += size_t(len);
    c.generated_tokens += len;
  }
}

}  // namespace

SampledCompletions sample_completions(const models::PretrainedModel& model, const Params& params,
                                      const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& o) {
  MT_CHECK(!prompts.empty(), "[sampling] no prompts");
  MT_CHECK(o.n >= 1 && o.max_new_tokens >= 1, "[sampling] n and max_new_tokens must be >= 1");
  models::PretrainedModel m = model;
  m.params = params;
  models::CausalLm lm = m.causal_lm();
  if (o.vocab_limit > 0 && o.vocab_limit < lm.vocab_size) lm = models::restrict_vocab(lm, o.vocab_limit);
  lm.stop_tokens = o.stop_tokens;
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  serve::EngineOptions eo;
  eo.max_batch = std::max(o.n, std::min<int64_t>(int64_t(prompts.size()) * o.n, std::max(o.max_batch, o.n)));
  eo.max_queue = int64_t(prompts.size()) + 1;
  eo.max_model_len = lm.max_positions > 0 ? lm.max_positions : int64_t(longest) + o.max_new_tokens;
  eo.precision = matmul_precision();
  eo.loop_on_caller = true;  // MPI: the model steps communicate from the main thread
  // Room for every sequence decoded together, at its longest.
  const int64_t bytes_per_token = serve::BatchDecoder(lm).kv_bytes_per_token();
  eo.kv_cache_bytes = eo.max_batch * (int64_t(longest) + o.max_new_tokens) * bytes_per_token;
  dist::Communicator& world = dist::world();
  SampledCompletions out;
  if (world.size() > 1 && world.rank() != 0) {
    serve::follow_steps(lm, serve::kv_cache_size(eo));
    std::string failure;
    share(out, failure);
    MT_CHECK(failure.empty(), "[sampling] generation failed on rank 0: ", failure);
    return out;
  }
  std::unique_ptr<serve::SequenceRunner> runner;
  if (world.size() > 1) runner = std::make_unique<serve::BroadcastRunner>(lm, serve::kv_cache_size(eo));
  else runner = std::make_unique<serve::LocalRunner>(lm, serve::kv_cache_size(eo));
  serve::Engine engine(std::move(runner), eo);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<serve::RequestStream>> streams;
  std::string failure;
  try {
    for (size_t p = 0; p < prompts.size(); ++p) {
      serve::EngineRequest r;
      r.prompts = {prompts[p]};
      r.n = o.n;
      r.sampling.max_tokens = o.max_new_tokens;
      r.sampling.temperature = o.temperature;
      r.sampling.top_p = o.top_p;
      r.sampling.top_k = o.top_k;
      r.sampling.seed = o.seed + p;
      streams.push_back(engine.submit(std::move(r)));
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  out.tokens.assign(prompts.size() * size_t(o.n), {});
  out.stopped.assign(out.tokens.size(), false);
  // The events are read beside the loop, which runs here; the reader stops it when done.
  std::thread reader([&] {
    for (size_t p = 0; p < streams.size(); ++p) {
      serve::TokenEvent e;
      while (streams[p]->next(e)) {
        const size_t choice = p * size_t(o.n) + size_t(e.choice);
        if (e.token >= 0) out.tokens[choice].push_back(e.token), ++out.generated_tokens;
        if (e.is_stop_token) out.stopped[choice] = true;
        if (e.finish == serve::FinishReason::error && failure.empty()) failure = e.error;
      }
    }
    engine.stop();
  });
  engine.run();
  reader.join();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  share(out, failure);
  MT_CHECK(failure.empty(), "[sampling] generation failed: ", failure);
  return out;
}

}  // namespace mt::posttrain
