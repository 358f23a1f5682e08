#include "meshtrain/models/generate.h"

#include "meshtrain/models/decoding.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// A decoder over left-padded prompts: the host rows (ids and 0/1 mask, all one length) and
// the KV cache of what the model has seen.
class CausalState final : public DecodingState {
 public:
  CausalState(const CausalLm& lm, const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& c)
      : lm_(lm), use_cache_(c.use_cache) {
    auto [ids0, mask0] = left_pad(prompts, c.pad_token_id);
    std::vector<int64_t> ids = ids0.to_ints(), mask = mask0.to_ints();
    const int64_t t = ids0.dim(1);
    for (size_t r = 0; r < prompts.size(); ++r) {
      ids_.emplace_back(ids.begin() + int64_t(r) * t, ids.begin() + int64_t(r + 1) * t);
      mask_.emplace_back(mask.begin() + int64_t(r) * t, mask.begin() + int64_t(r + 1) * t);
    }
  }
  int64_t rows() const override { return int64_t(ids_.size()); }
  int64_t vocab_size() const override { return lm_.vocab_size; }
  const std::vector<int64_t>& sequence(int64_t row) const override { return ids_[size_t(row)]; }

  // The whole sequence without a cache (or on the first step), else only the newest token
  // against the cache.
  std::vector<float> next_logits() override {
    const bool incremental = use_cache_ && !first_;
    const int64_t n = incremental ? 1 : length();
    std::vector<int64_t> ids, mask;
    for (size_t r = 0; r < ids_.size(); ++r) {
      ids.insert(ids.end(), ids_[r].end() - n, ids_[r].end());
      mask.insert(mask.end(), mask_[r].begin(), mask_[r].end());
    }
    DecoderInputs in;
    in.input_ids = Array::from_vector(ids, Shape{rows(), n});
    in.attention_mask = Array::from_vector(mask, Shape{rows(), length()});
    in.logits_to_keep = 1;  // only the next token's: rows are left-padded
    first_ = false;
    return last_logits(lm_.forward(in, use_cache_ ? &cache_ : nullptr), rows(), lm_.vocab_size);
  }
  void append(const std::vector<int64_t>& tokens) override {
    for (size_t r = 0; r < ids_.size(); ++r) ids_[r].push_back(tokens[r]), mask_[r].push_back(1);
  }
  void select_rows(const std::vector<int64_t>& src) override {
    std::vector<std::vector<int64_t>> ids, mask;
    for (int64_t s : src) ids.push_back(ids_[size_t(s)]), mask.push_back(mask_[size_t(s)]);
    ids_ = std::move(ids), mask_ = std::move(mask);
    if (use_cache_) cache_.select_rows(src);
  }

 private:
  int64_t length() const { return ids_.empty() ? 0 : int64_t(ids_[0].size()); }
  const CausalLm& lm_;
  bool use_cache_;
  std::vector<std::vector<int64_t>> ids_, mask_;
  KvCache cache_;
  bool first_ = true;
};

void check_prompts(const CausalLm& lm, const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& c) {
  MT_CHECK(lm.forward, "[generate] the model has no forward function");
  check_generation_config(c, lm.vocab_size);
  MT_CHECK(!prompts.empty(), "[generate] no prompts");
  for (size_t i = 0; i < prompts.size(); ++i) {
    MT_CHECK(!prompts[i].empty(), "[generate] prompt ", i, " is empty");
    for (int64_t t : prompts[i])
      MT_CHECK(t >= 0 && t < lm.vocab_size, "[generate] prompt ", i, " has token ", t, " outside the vocabulary of ",
               lm.vocab_size);
  }
}

struct Hypothesis {
  std::vector<int64_t> tokens;
  double score;
};

bool is_stop(const std::vector<int64_t>& stops, int64_t tok) {
  return std::find(stops.begin(), stops.end(), tok) != stops.end();
}

// Row r's log-probabilities with the logit rules applied.
std::vector<float> rule_log_probs(const float* row, int64_t v, const std::vector<int64_t>& sequence, int64_t new_tokens,
                                  const GenerationConfig& c, const std::vector<int64_t>& stops) {
  const double lse = log_sum_exp(row, v);
  std::vector<float> lp(static_cast<size_t>(v));
  for (int64_t t = 0; t < v; ++t) lp[size_t(t)] = float(double(row[t]) - lse);
  apply_logit_rules(lp, sequence, new_tokens, c, stops);
  return lp;
}

GenerationResult run_beam_search(DecodingState& state, const GenerationConfig& c, const std::vector<int64_t>& stops,
                                 int64_t budget) {
  const int64_t nb = c.num_beams, b = state.rows(), v = state.vocab_size(), rows = b * nb;
  GenerationResult res;
  auto penalized = [&](double sum_logprobs, int64_t len) { return sum_logprobs / std::pow(double(len), c.length_penalty); };
  std::vector<double> beam_scores(size_t(rows), kNegInf);
  for (int64_t i = 0; i < b; ++i) beam_scores[size_t(i * nb)] = 0;  // first step expands beam 0 only
  std::vector<std::vector<int64_t>> beam_tokens(static_cast<size_t>(rows));
  std::vector<std::vector<Hypothesis>> hyps(static_cast<size_t>(b));
  std::vector<bool> done(size_t(b), false);

  for (int64_t step = 0; step < budget; ++step) {
    std::vector<float> logits = state.next_logits();
    if (c.return_logits) res.step_logits.push_back(Array::from_vector(logits, Shape{state.rows(), v}));
    if (step == 0) {
      // Every beam of a prompt starts from the prompt's single forward pass.
      std::vector<int64_t> expand;
      for (int64_t r = 0; r < rows; ++r) expand.push_back(r / nb);
      state.select_rows(expand);
      std::vector<float> e(size_t(rows * v));
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(logits.begin() + (r / nb) * v, v, e.begin() + r * v);
      logits = std::move(e);
    }
    const int64_t gen_len = step + 1;
    std::vector<int64_t> src(static_cast<size_t>(rows)), next(static_cast<size_t>(rows));
    std::vector<double> next_scores(static_cast<size_t>(rows));
    for (int64_t i = 0; i < b; ++i) {
      if (done[size_t(i)]) {
        for (int64_t j = 0; j < nb; ++j) {
          size_t r = size_t(i * nb + j);
          src[r] = int64_t(r), next[r] = c.pad_token_id, next_scores[r] = beam_scores[r];
        }
        continue;
      }
      // Candidates (score, flat index j * V + token) of this prompt's beams: keep the best 2·nb.
      using Cand = std::pair<double, int64_t>;
      auto better = [](const Cand& a, const Cand& o) { return a.first > o.first || (a.first == o.first && a.second < o.second); };
      std::vector<Cand> top;
      const size_t want = size_t(2 * nb);
      for (int64_t j = 0; j < nb; ++j) {
        const int64_t r = i * nb + j;
        if (beam_scores[size_t(r)] == kNegInf) continue;
        const std::vector<float> lp = rule_log_probs(logits.data() + r * v, v, state.sequence(r), step, c, stops);
        for (int64_t t = 0; t < v; ++t) {
          if (lp[size_t(t)] == -std::numeric_limits<float>::infinity()) continue;
          Cand cand{beam_scores[size_t(r)] + double(lp[size_t(t)]), j * v + t};
          if (top.size() < want) {
            top.push_back(cand);
            std::push_heap(top.begin(), top.end(), better);  // heap front = worst kept
          } else if (better(cand, top.front())) {
            std::pop_heap(top.begin(), top.end(), better);
            top.back() = cand;
            std::push_heap(top.begin(), top.end(), better);
          }
        }
      }
      std::sort(top.begin(), top.end(), better);
      int64_t filled = 0;
      for (size_t rank = 0; rank < top.size() && filled < nb; ++rank) {
        const int64_t j = top[rank].second / v, tok = top[rank].second % v, from = i * nb + j;
        if (is_stop(stops, tok)) {
          // A stop token ranked below the first nb candidates does not finish a hypothesis (HF).
          if (int64_t(rank) >= nb) continue;
          std::vector<int64_t> h = beam_tokens[size_t(from)];
          h.push_back(tok);
          hyps[size_t(i)].push_back({std::move(h), penalized(top[rank].first, gen_len)});
          continue;
        }
        const size_t r = size_t(i * nb + filled++);
        src[r] = from, next[r] = tok, next_scores[r] = top[rank].first;
      }
      for (; filled < nb; ++filled) {  // fewer live candidates than beams (tiny vocabularies)
        const size_t r = size_t(i * nb + filled);
        src[r] = i * nb, next[r] = c.pad_token_id, next_scores[r] = kNegInf;
      }
      auto& hs = hyps[size_t(i)];
      std::stable_sort(hs.begin(), hs.end(), [](const Hypothesis& a, const Hypothesis& o) { return a.score > o.score; });
      if (int64_t(hs.size()) > nb) hs.resize(static_cast<size_t>(nb));
      if (int64_t(hs.size()) >= nb) {
        const double best_running = next_scores[size_t(i * nb)];
        done[size_t(i)] = c.early_stopping || hs.back().score >= penalized(best_running, gen_len) ||
                          best_running == kNegInf;
      }
    }
    std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      tokens[size_t(r)] = beam_tokens[size_t(src[size_t(r)])];
      tokens[size_t(r)].push_back(next[size_t(r)]);
    }
    beam_tokens = std::move(tokens);
    beam_scores = next_scores;
    state.select_rows(src);
    state.append(next);
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
  }
  for (int64_t i = 0; i < b; ++i) {
    auto& hs = hyps[size_t(i)];
    if (!done[size_t(i)])
      for (int64_t j = 0; j < nb; ++j) {
        const size_t r = size_t(i * nb + j);
        if (beam_scores[r] != kNegInf && !beam_tokens[r].empty())
          hs.push_back({beam_tokens[r], penalized(beam_scores[r], int64_t(beam_tokens[r].size()))});
      }
    auto best = std::max_element(hs.begin(), hs.end(), [](const Hypothesis& a, const Hypothesis& o) {
      return a.score < o.score;
    });
    res.tokens.push_back(best == hs.end() ? std::vector<int64_t>{} : best->tokens);
    res.scores.push_back(best == hs.end() ? 0.0 : best->score);
  }
  return res;
}

GenerationResult run_greedy_or_sampling(DecodingState& state, const GenerationConfig& c,
                                        const std::vector<int64_t>& stops, int64_t budget) {
  const int64_t b = state.rows(), v = state.vocab_size();
  GenerationResult res;
  res.tokens.resize(static_cast<size_t>(b));
  res.scores.assign(size_t(b), 0.0);
  std::vector<bool> done(size_t(b), false);
  const RngKey key{c.seed, 0x67656e};  // "gen": generation's own stream of the seed
  for (int64_t step = 0; step < budget; ++step) {
    std::vector<float> logits = state.next_logits();
    if (c.return_logits) res.step_logits.push_back(Array::from_vector(logits, Shape{b, v}));
    std::vector<int64_t> next(size_t(b), c.pad_token_id);
    for (int64_t r = 0; r < b; ++r) {
      if (done[size_t(r)]) continue;
      std::vector<float> row(logits.begin() + r * v, logits.begin() + (r + 1) * v);
      const double lse = log_sum_exp(row.data(), v);
      std::vector<float> ruled = row;
      apply_logit_rules(ruled, state.sequence(r), step, c, stops);
      const double u = uniform_at(key.fold_in(uint64_t(step)).fold_in(uint64_t(r)), 0);
      const int64_t tok = choose_token(ruled, c, u);
      next[size_t(r)] = tok;
      res.tokens[size_t(r)].push_back(tok);
      res.scores[size_t(r)] += double(row[size_t(tok)]) - lse;
      if (is_stop(stops, tok)) done[size_t(r)] = true;
    }
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    state.append(next);
  }
  return res;
}

}  // namespace

std::pair<Array, Array> left_pad(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_token_id) {
  MT_CHECK(!prompts.empty(), "[left_pad] no prompts");
  size_t t = 0;
  for (const auto& p : prompts) t = std::max(t, p.size());
  const int64_t b = int64_t(prompts.size());
  std::vector<int64_t> ids(size_t(b) * t, pad_token_id), mask(size_t(b) * t, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const size_t off = i * t + (t - prompts[i].size());
    std::copy(prompts[i].begin(), prompts[i].end(), ids.begin() + off);
    std::fill_n(mask.begin() + off, prompts[i].size(), 1);
  }
  return {Array::from_vector(ids, Shape{b, int64_t(t)}), Array::from_vector(mask, Shape{b, int64_t(t)})};
}

double log_sum_exp(const float* x, int64_t n) {
  double m = kNegInf;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(x[i]));
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  return m + std::log(s);
}

int64_t choose_token(std::span<const float> logits, const GenerationConfig& c, double u) {
  const int64_t v = int64_t(logits.size());
  MT_CHECK(v > 0, "[generate] empty logits");
  if (c.temperature == 0) return int64_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Most likely first; ties keep the lower id first.
  std::vector<int64_t> order(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), int64_t(0));
  const int64_t keep = c.top_k > 0 ? std::min(c.top_k, v) : v;
  auto by_logit = [&](int64_t a, int64_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  if (keep < v) std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_logit);
  else std::sort(order.begin(), order.end(), by_logit);
  order.resize(static_cast<size_t>(keep));
  const double top = double(logits[size_t(order[0])]) / c.temperature;
  std::vector<double> p(order.size());
  double total = 0;
  for (size_t i = 0; i < order.size(); ++i) total += p[i] = std::exp(double(logits[size_t(order[i])]) / c.temperature - top);
  size_t n = p.size();
  if (c.top_p < 1.0) {
    // The smallest prefix whose mass reaches top_p (at least one token).
    double mass = 0;
    for (n = 0; n < p.size();) {
      mass += p[n++] / total;
      if (mass >= c.top_p) break;
    }
  }
  double kept = 0;
  for (size_t i = 0; i < n; ++i) kept += p[i];
  double target = u * kept, cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += p[i];
    if (target < cum) return order[i];
  }
  return order[n - 1];  // u rounding to the very end
}

std::vector<float> last_logits(const Array& logits, int64_t rows, int64_t vocab) {
  MT_CHECK(logits.ndim() == 3 && logits.dim(0) == rows && logits.dim(2) == vocab, "[generate] model returned logits ",
           logits.str(), ", expected (", rows, ", T, ", vocab, ")");
  Array last = reshape(slice(logits, 1, logits.dim(1) - 1, logits.dim(1)), {rows, vocab});
  last = cast(last, DType::f32);
  // With vocab-parallel weights the logits are split over ranks: every rank gathers them
  // and chooses the same tokens.
  std::vector<float> host = dist::to_host(last).to_floats();
  return host;
}

void check_generation_config(const GenerationConfig& c, int64_t vocab_size) {
  MT_CHECK(vocab_size > 0, "[generate] the model's vocab_size is ", vocab_size);
  MT_CHECK(c.max_new_tokens >= 0, "[generate] max_new_tokens must be >= 0, got ", c.max_new_tokens);
  MT_CHECK(c.temperature >= 0 && std::isfinite(c.temperature), "[generate] temperature must be >= 0, got ",
           c.temperature);
  MT_CHECK(c.top_k >= 0, "[generate] top_k must be >= 0, got ", c.top_k);
  MT_CHECK(c.top_p > 0 && c.top_p <= 1, "[generate] top_p must be in (0, 1], got ", c.top_p);
  MT_CHECK(c.num_beams >= 1, "[generate] num_beams must be >= 1, got ", c.num_beams);
  MT_CHECK(c.min_new_tokens >= 0, "[generate] min_new_tokens must be >= 0, got ", c.min_new_tokens);
  MT_CHECK(c.no_repeat_ngram_size >= 0, "[generate] no_repeat_ngram_size must be >= 0, got ", c.no_repeat_ngram_size);
  MT_CHECK(c.pad_token_id >= 0 && c.pad_token_id < vocab_size, "[generate] pad_token_id ", c.pad_token_id,
           " is outside the vocabulary of ", vocab_size);
  for (const auto& [name, id] : {std::pair{"forced_bos_token_id", c.forced_bos_token_id},
                                 std::pair{"forced_eos_token_id", c.forced_eos_token_id}})
    MT_CHECK(!id || (*id >= 0 && *id < vocab_size), "[generate] ", name, " ", id.value_or(0),
             " is outside the vocabulary of ", vocab_size);
}

void apply_logit_rules(std::vector<float>& scores, const std::vector<int64_t>& seq, int64_t new_tokens,
                       const GenerationConfig& c, const std::vector<int64_t>& stops) {
  const float ban = -std::numeric_limits<float>::infinity();
  const int64_t v = int64_t(scores.size());
  if (new_tokens < c.min_new_tokens)
    for (int64_t s : stops)
      if (s >= 0 && s < v) scores[size_t(s)] = ban;
  const int64_t n = c.no_repeat_ngram_size, len = int64_t(seq.size());
  if (n > 0 && len + 1 >= n) {
    // Every earlier n-gram whose first n-1 tokens equal the sequence's last n-1 bans its last.
    for (int64_t i = 0; i + n <= len; ++i)
      if (std::equal(seq.begin() + i, seq.begin() + i + n - 1, seq.end() - (n - 1)))
        scores[size_t(seq[size_t(i + n - 1)])] = ban;
  }
  auto force = [&](int64_t id) {
    std::fill(scores.begin(), scores.end(), ban);
    scores[size_t(id)] = 0;  // HF's forced-token processors score it 0, whatever the model said
  };
  if (c.forced_bos_token_id && new_tokens == 0) force(*c.forced_bos_token_id);
  if (c.forced_eos_token_id && new_tokens == c.max_new_tokens - 1) force(*c.forced_eos_token_id);
}

GenerationResult run_search(DecodingState& state, const GenerationConfig& c, const std::vector<int64_t>& stops,
                            int64_t budget) {
  autodiff::NoGradGuard no_grad;
  return c.num_beams > 1 ? run_beam_search(state, c, stops, budget) : run_greedy_or_sampling(state, c, stops, budget);
}

namespace {

// Stop tokens in effect and the number of steps the position limit allows.
std::pair<std::vector<int64_t>, int64_t> prepare(const CausalLm& lm, const std::vector<std::vector<int64_t>>& prompts,
                                                 const GenerationConfig& c) {
  check_prompts(lm, prompts, c);
  std::vector<int64_t> stops = c.stop_tokens;
  if (stops.empty() && !c.ignore_model_stop_tokens) stops = lm.stop_tokens;
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  int64_t budget = c.max_new_tokens;
  if (lm.max_positions > 0) {
    MT_CHECK(int64_t(longest) <= lm.max_positions, "[generate] a prompt of ", longest,
             " tokens exceeds the model's maximum of ", lm.max_positions, " positions");
    budget = std::min(budget, lm.max_positions - int64_t(longest));
  }
  return {stops, budget};
}

}  // namespace

GenerationResult beam_search(const CausalLm& lm, const std::vector<std::vector<int64_t>>& prompts,
                             const GenerationConfig& c) {
  autodiff::NoGradGuard no_grad;
  auto [stops, budget] = prepare(lm, prompts, c);
  CausalState state(lm, prompts, c);
  return run_beam_search(state, c, stops, budget);
}

GenerationResult generate(const CausalLm& lm, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationConfig& c) {
  autodiff::NoGradGuard no_grad;
  auto [stops, budget] = prepare(lm, prompts, c);
  CausalState state(lm, prompts, c);
  return run_search(state, c, stops, budget);
}

}  // namespace mt::models
