// The continuous-batching engine of `meshtrain serve` on a real trained model (llama2.c's
// stories260K) and a random GPT-2: a request gets the tokens `generate` gives it alone,
// whether it runs alone, among 16, or joins a batch mid-flight; seeded sampling draws as
// `generate --seed`; the KV-cache budget is never passed; cancellation frees room; bad
// requests are refused with the reason.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/models/generate.h"
#include "meshtrain/models/decoding.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/serve/batch_decoder.h"
#include "meshtrain/serve/completion_run.h"
#include "meshtrain/serve/openai_protocol.h"
#include "meshtrain/serve/engine.h"
#include "meshtrain/serve/paged_kv_cache.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

using namespace mt::serve;
using models::CausalLm;

const std::string kStories = std::string(MT_DATA_DIR) + "/models/stories260K/stories260K.bin";

CausalLm stories() {
  models::PretrainedOptions po;
  po.print_report = false;
  static const models::PretrainedModel m = models::from_pretrained(kStories, po);
  return m.causal_lm();
}

CausalLm tiny_gpt2() {
  models::Gpt2Config c;
  c.vocab_size = 37, c.n_positions = 64, c.n_embd = 16, c.n_layer = 2, c.n_head = 4;
  Params p = models::gpt2_init(c, {5, 0});
  Params scaled;
  for (const auto& [k, v] : p) scaled.set(k, v.ndim() == 2 ? mul(v, 20.0) : v);
  return models::gpt2_causal_lm(c, scaled);  // the closure holds the weights' handles
}

struct Outcome {
  std::vector<std::vector<int64_t>> tokens;  // per choice
  std::vector<FinishReason> finish;
};

Outcome collect(RequestStream& s) {
  Outcome o;
  o.tokens.resize(size_t(s.choices()));
  o.finish.assign(size_t(s.choices()), FinishReason::none);
  TokenEvent e;
  while (s.next(e)) {
    if (e.token >= 0) o.tokens[size_t(e.choice)].push_back(e.token);
    if (e.finish != FinishReason::none) o.finish[size_t(e.choice)] = e.finish;
  }
  return o;
}

EngineRequest request(std::vector<int64_t> prompt, int64_t max_tokens, double temperature = 0) {
  EngineRequest r;
  r.prompts = {std::move(prompt)};
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  return r;
}

std::vector<int64_t> alone(const CausalLm& lm, const std::vector<int64_t>& prompt, int64_t max_new,
                           models::GenerationConfig g = {}) {
  g.max_new_tokens = max_new;
  return models::generate(lm, {prompt}, g).tokens[0];
}

// Prompts of several lengths from the model's own vocabulary.
std::vector<std::vector<int64_t>> prompts(int64_t count, int64_t vocab) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int64_t> p = {1};
    for (int64_t j = 0; j < 1 + (i * 7) % 13; ++j) p.push_back(2 + (i * 31 + j * 17) % (vocab - 2));
    out.push_back(p);
  }
  return out;
}

// Prompts prefilled together or alone, then decoded together or alone. Blocks of 4 positions:
// every row crosses block boundaries while it decodes, and rows of one step hold different
// numbers of blocks.
TEST(ServeBatchDecoder, RowsOfABatchMatchEachRowAlone) {
  for (const auto& [name, lm] : {std::pair{"stories260K", stories()}, std::pair{"gpt2", tiny_gpt2()}}) {
    BatchDecoder d(lm);
    const auto ps = prompts(16, lm.vocab_size);
    const int64_t v = lm.vocab_size;
    PagedKvCache batch(96, 4), solo(96, 4);
    std::vector<int64_t> next(ps.size()), ids;
    // The batch's prompts prefilled together (left-padded to the longest), each solo one alone.
    models::KvCache padded;
    const std::vector<float> all = d.prefill_batch(ps, padded);
    double worst_prefill = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      models::KvCache own;
      std::vector<float> a = d.prefill(ps[i], own);
      for (int64_t t = 0; t < v; ++t)
        worst_prefill = std::max(worst_prefill, double(std::fabs(a[size_t(t)] - all[i * size_t(v) + size_t(t)])));
      batch.store(int64_t(i), padded, int64_t(i), int64_t(ps[i].size()));
      solo.store(int64_t(i), own);
      ids.push_back(int64_t(i));
      next[i] = int64_t(std::max_element(a.begin(), a.end()) - a.begin());
    }
    std::cout << "  " << name << ": 16 prompts prefilled together vs alone: max |logit diff| = " << worst_prefill
              << "\n";
    EXPECT_LE(worst_prefill, 1e-4) << name;
    double worst = 0;
    for (int step = 0; step < 6; ++step) {
      models::PagedKvStep all = batch.step(ids);
      std::vector<float> together = d.decode(all, next);
      for (size_t i = 0; i < ps.size(); ++i) {
        models::PagedKvStep own = solo.step({int64_t(i)});
        std::vector<float> one = d.decode(own, {next[i]});
        for (int64_t t = 0; t < v; ++t)
          worst = std::max(worst, double(std::fabs(one[size_t(t)] - together[i * size_t(v) + size_t(t)])));
        next[i] = int64_t(std::max_element(one.begin(), one.end()) - one.begin());
      }
    }
    std::cout << "  " << name << ": batch of 16 vs alone, 6 decode steps, max |logit diff| = " << worst << "\n";
    EXPECT_LE(worst, 1e-4) << name;
  }
}

// The paged cache's decode steps give the logits of the ordinary cache's (generate's), and a
// forked sequence continues as its source; dropped sequences give their blocks back.
TEST(ServePagedKvCache, DecodesAsTheOrdinaryCacheAndForksCopyTheSequence) {
  const CausalLm lm = stories();
  BatchDecoder d(lm);
  const std::vector<int64_t> prompt = {1, 403, 407, 261, 300, 17};
  models::KvCache ordinary, prefilled;
  std::vector<float> logits = d.prefill(prompt, prefilled);
  d.prefill(prompt, ordinary);
  PagedKvCache paged(16, 4);
  paged.store(0, prefilled);
  paged.fork(0, 1);
  EXPECT_EQ(paged.free_blocks(), 16 - 2 * 2);
  int64_t token = int64_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  double worst = 0;
  for (int step = 0; step < 9; ++step) {
    models::DecoderInputs in;
    in.input_ids = Array::from_vector(std::vector<int64_t>{token}, Shape{1, 1});
    std::vector<float> expected;
    {
      autodiff::NoGradGuard no_grad;
      expected = models::last_logits(lm.forward(in, &ordinary), 1, lm.vocab_size);
    }
    models::PagedKvStep both = paged.step({0, 1});
    std::vector<float> got = d.decode(both, {token, token});
    for (size_t t = 0; t < expected.size(); ++t)
      for (size_t row = 0; row < 2; ++row)
        worst = std::max(worst, double(std::fabs(expected[t] - got[row * expected.size() + t])));
    token = int64_t(std::max_element(expected.begin(), expected.end()) - expected.begin());
  }
  std::cout << "  paged vs ordinary KV cache, 9 decode steps (source and fork): max |logit diff| = " << worst << "\n";
  EXPECT_LE(worst, 1e-4);
  EXPECT_EQ(paged.length(0), int64_t(prompt.size()) + 9);
  EXPECT_EQ(paged.free_blocks(), 16 - 2 * 4);
  paged.drop(0);
  paged.drop(1);
  EXPECT_EQ(paged.free_blocks(), 16);
  EXPECT_EQ(paged.bytes_in_use(), 0);
}

// A store or a step the pool cannot hold fails naming the pool and changes nothing: no block
// is lost and no length moves.
TEST(ServePagedKvCache, WhatDoesNotFitFailsAndChangesNothing) {
  const CausalLm lm = stories();
  BatchDecoder d(lm);
  models::KvCache prefilled;
  d.prefill({1, 403, 407, 261, 300}, prefilled);  // 5 positions: 2 blocks of 4
  PagedKvCache paged(3, 4);
  paged.store(0, prefilled);
  EXPECT_EQ(paged.free_blocks(), 1);
  EXPECT_THROW(paged.store(1, prefilled), Error);  // needs 2 blocks
  EXPECT_THROW(paged.fork(0, 1), Error);
  EXPECT_EQ(paged.free_blocks(), 1);
  EXPECT_THROW(paged.length(1), Error);
  for (int i = 0; i < 7; ++i) paged.step({0});  // 5 -> 12 positions: the third block taken at 9
  EXPECT_EQ(paged.length(0), 12);
  EXPECT_EQ(paged.free_blocks(), 0);
  try {
    paged.step({0});
    ADD_FAILURE() << "a step past the pool did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV pool of 3 blocks is exhausted"), std::string::npos) << e.what();
  }
  EXPECT_EQ(paged.length(0), 12);
  paged.drop(0);
  EXPECT_EQ(paged.free_blocks(), 3);
}

TEST(ServeEngine, GreedyRequestsEqualGenerateAloneAndInABatchOf16) {
  const CausalLm lm = stories();
  Engine engine(lm, {});
  const auto ps = prompts(16, lm.vocab_size);
  std::vector<std::vector<int64_t>> expected;
  for (const auto& p : ps) expected.push_back(alone(lm, p, 40));
  // One at a time.
  for (size_t i = 0; i < 3; ++i) {
    auto s = engine.submit(request(ps[i], 40));
    EXPECT_EQ(collect(*s).tokens[0], expected[i]) << "prompt " << i;
  }
  // All 16 together.
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : ps) streams.push_back(engine.submit(request(p, 40)));
  for (size_t i = 0; i < ps.size(); ++i) {
    Outcome o = collect(*streams[i]);
    EXPECT_EQ(o.tokens[0], expected[i]) << "prompt " << i;
    const bool stopped = !expected[i].empty() && expected[i].back() == 1;  // llama2.c's end: BOS
    EXPECT_EQ(o.finish[0], stopped ? FinishReason::stop : FinishReason::length);
  }
  EngineStats st = engine.stats();
  int64_t big_steps = 0;
  for (size_t b = 8; b < st.batch_size_counts.size(); ++b) big_steps += st.batch_size_counts[b];
  std::cout << "  decode steps " << st.steps << ", of which " << big_steps << " ran 8 or more sequences\n";
  EXPECT_GT(big_steps, 0) << "the 16 requests never shared a step";
}

// A model served without a tokenizer: a prompt of token ids is answered with the generated
// ids (token_ids; there is no text to give), the same ids generate gives.
TEST(ServeEngine, WithoutATokenizerIdPromptsGetTokenIds) {
  const CausalLm lm = tiny_gpt2();
  Engine engine(lm, {});
  ServedModel model;
  model.name = "tiny";
  model.max_model_len = 64;
  model.max_prompt_tokens = 40;
  model.max_tokens_limit = 63;
  const std::vector<int64_t> prompt = {3, 5, 7};
  ParsedRequest r = parse_completion_request(
      {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}}, model);
  const nlohmann::json answer = CompletionRun(engine, model, std::move(r), "cmpl-1").response();
  const nlohmann::json& choice = answer["choices"][0];
  ASSERT_TRUE(choice.contains("token_ids")) << answer.dump();
  std::vector<int64_t> expected = alone(lm, prompt, 6);
  if (!expected.empty() && lm.stop_tokens.size() && expected.back() == lm.stop_tokens[0]) expected.pop_back();
  EXPECT_EQ(choice["token_ids"].get<std::vector<int64_t>>(), expected) << answer.dump();
  try {
    parse_completion_request({{"model", "tiny"}, {"prompt", "hello"}}, model);
    ADD_FAILURE() << "a text prompt was accepted without a tokenizer";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("send the prompt as token ids"), std::string::npos) << e.what();
  }
}

TEST(ServeEngine, ARequestJoiningMidFlightChangesNoOnesTokens) {
  const CausalLm lm = tiny_gpt2();
  Engine engine(lm, {});
  models::GenerationConfig g;
  g.ignore_model_stop_tokens = true;
  const std::vector<int64_t> a = {3, 9, 4}, b = {7, 1, 2, 8, 30, 11};
  EngineRequest ra = request(a, 50), rb = request(b, 20);
  ra.sampling.ignore_eos = rb.sampling.ignore_eos = true;
  auto sa = engine.submit(ra);
  // Read some of A's tokens, so that B arrives while A is decoding.
  std::vector<int64_t> got_a;
  TokenEvent e;
  while (got_a.size() < 10 && sa->next(e)) got_a.push_back(e.token);
  auto sb = engine.submit(rb);
  Outcome ob = collect(*sb), oa = collect(*sa);
  got_a.insert(got_a.end(), oa.tokens[0].begin(), oa.tokens[0].end());
  EXPECT_EQ(got_a, alone(lm, a, 50, g));
  EXPECT_EQ(ob.tokens[0], alone(lm, b, 20, g));
}

TEST(ServeEngine, SeededSamplingDrawsAsGenerateAndChoicesDiffer) {
  const CausalLm lm = stories();
  Engine engine(lm, {});
  models::GenerationConfig g;
  g.temperature = 0.9, g.top_k = 40, g.top_p = 0.9, g.seed = 11;
  EngineRequest r = request({1, 403, 407}, 30, 0.9);
  r.sampling.top_k = 40, r.sampling.top_p = 0.9, r.sampling.seed = 11;
  r.n = 3;
  Outcome o = collect(*engine.submit(r));
  EXPECT_EQ(o.tokens[0], alone(lm, {1, 403, 407}, 30, g));
  EXPECT_NE(o.tokens[0], o.tokens[1]);
  EXPECT_NE(o.tokens[1], o.tokens[2]);
  // Two prompts in one request: prompt p's first choice is still generate's draw.
  EngineRequest two = r;
  two.prompts = {{1, 403}, {1, 403, 407}};
  two.n = 2;
  Outcome t = collect(*engine.submit(two));
  ASSERT_EQ(t.tokens.size(), 4u);
  EXPECT_EQ(t.tokens[0], alone(lm, {1, 403}, 30, g));
  EXPECT_EQ(t.tokens[2], o.tokens[0]);
  EXPECT_EQ(t.tokens[3], o.tokens[1]);
}

TEST(ServeEngine, KvBudgetIsNeverPassedAndQueuedRequestsComplete) {
  const CausalLm lm = stories();
  EngineOptions opt;
  Engine probe(lm, opt);
  const int64_t per_token = probe.kv_bytes_per_token();
  probe.stop();
  // Room for two requests of (prompt 4 + 60 tokens) at a time.
  opt.kv_cache_bytes = 2 * 64 * per_token + per_token / 2;
  opt.max_queue = 3;
  Engine engine(lm, opt);
  std::vector<std::shared_ptr<RequestStream>> streams;
  int refused = 0;
  for (int i = 0; i < 6; ++i) {
    EngineRequest r = request({1, 403, 407, int64_t(300 + i)}, 60);
    r.sampling.ignore_eos = true;
    if (i == 0) {
      streams.push_back(engine.submit(r));
      TokenEvent e;
      ASSERT_TRUE(streams[0]->next(e));  // running now
      continue;
    }
    // At most two run, so of these five at least three wait: the queue of three refuses one or more.
    try {
      streams.push_back(engine.submit(r));
    } catch (const AdmissionError& e) {
      EXPECT_EQ(e.kind(), AdmissionError::Kind::queue_full) << e.what();
      ++refused;
    }
  }
  EXPECT_GE(refused, 1);
  EXPECT_GE(streams.size(), 4u);
  int64_t most = 0;
  for (int polls = 0; polls < 20000; ++polls) {
    EngineStats st = engine.stats();
    EXPECT_LE(st.kv_reserved_bytes, opt.kv_cache_bytes);
    EXPECT_LE(st.kv_used_bytes, opt.kv_cache_bytes);
    EXPECT_LE(st.running_sequences, 2);
    most = std::max(most, st.running_sequences);
    if (st.running_sequences == 0 && st.waiting_requests == 0 && polls > 10) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(most, 2);
  for (size_t i = 0; i < streams.size(); ++i) {
    Outcome o = collect(*streams[i]);
    EXPECT_EQ(o.finish[0], FinishReason::length) << "request " << i;
  }
  // A request that could never fit is refused at once.
  EngineRequest huge = request({1, 2, 3}, 60);
  huge.n = 3;
  try {
    engine.submit(huge);
    ADD_FAILURE() << "no error";
  } catch (const AdmissionError& e) {
    EXPECT_EQ(e.kind(), AdmissionError::Kind::too_large);
    EXPECT_NE(std::string(e.what()).find("--kv-cache-mb"), std::string::npos) << e.what();
  }
}

TEST(ServeEngine, CancellationEndsTheRequestAndFreesItsRoom) {
  const CausalLm lm = stories();
  Engine engine(lm, {});
  EngineRequest r = request({1, 403}, 400);
  r.sampling.ignore_eos = true;
  auto s = engine.submit(r);
  TokenEvent e;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->next(e));
  s->cancel();
  Outcome o = collect(*s);
  EXPECT_EQ(o.finish[0], FinishReason::cancelled);
  EXPECT_LT(o.tokens[0].size(), 397u);
  for (int polls = 0; polls < 1000 && engine.stats().kv_reserved_bytes != 0; ++polls)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(engine.stats().kv_reserved_bytes, 0);
  EXPECT_EQ(engine.stats().running_sequences, 0);
  // One choice of several: the others go on to their end.
  r.n = 2;
  r.sampling.max_tokens = 30;
  auto two = engine.submit(r);
  two->cancel(0);
  Outcome t = collect(*two);
  EXPECT_EQ(t.finish[1], FinishReason::length);
  EXPECT_EQ(t.tokens[1].size(), 30u);
}

TEST(ServeEngine, StopTokenEndsAChoice) {
  const CausalLm lm = stories();
  Engine engine(lm, {});
  // `meshtrain generate` ends this story at BOS (1) after 16 tokens (generate_e2e_test).
  const std::vector<int64_t> prompt = {1, 403, 407, 261, 378};
  const std::vector<int64_t> expected = alone(lm, prompt, 100);
  ASSERT_EQ(expected.size(), 16u);
  ASSERT_EQ(expected.back(), 1);
  auto s = engine.submit(request(prompt, 100));
  std::vector<int64_t> got;
  TokenEvent e, last;
  while (s->next(e)) got.push_back(e.token), last = e;
  EXPECT_EQ(got, expected);
  EXPECT_TRUE(last.is_stop_token);
  EXPECT_EQ(last.finish, FinishReason::stop);
}

TEST(ServeEngine, BadRequestsAreRefusedWithTheReason) {
  const CausalLm lm = tiny_gpt2();
  EngineOptions opt;
  opt.max_batch = 4;
  Engine engine(lm, opt);
  auto refused = [&](EngineRequest r, AdmissionError::Kind kind, const std::string& words) {
    try {
      engine.submit(r);
      ADD_FAILURE() << "no error for " << words;
    } catch (const AdmissionError& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  using K = AdmissionError::Kind;
  refused(request({}, 5), K::invalid, "prompt 0 is empty");
  refused(request({1, 99}, 5), K::invalid, "token 99 outside the vocabulary of 37");
  refused(request({1}, 0), K::invalid, "max_tokens must be >= 1");
  refused(request({1}, 5, -1), K::invalid, "temperature");
  refused(request({1, 2, 3}, 62), K::too_large, "maximum context length is 64 tokens, but 65");
  EngineRequest many = request({1}, 5);
  many.n = 5;
  refused(many, K::invalid, "exceed the server's batch of 4");
  engine.stop();
  refused(request({1}, 5), K::stopped, "shutting down");
}

}  // namespace
}  // namespace mt::testing
