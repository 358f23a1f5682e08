#include "meshtrain/posttrain/grpo_rollout.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/autodiff/precision_policy.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/posttrain/dpo.h"
#include "meshtrain/posttrain/rank0_share.h"
#include "meshtrain/posttrain/sampling.h"
#include "meshtrain/posttrain/token_logprobs.h"

namespace mt::posttrain {

data::Example prompt_example(const std::string& text, const std::vector<int64_t>& ids, const data::Example& row) {
  MT_CHECK(!ids.empty(), "[grpo] a prompt tokenizes to nothing: '", text, "'");
  data::Example e = row;
  e.set("prompt", text);
  e.set("prompt_tokens", ids);
  return e;
}

std::shared_ptr<const data::Dataset> with_prompt_indices(std::shared_ptr<const data::Dataset> prompts) {
  std::vector<data::Example> out;
  for (int64_t i = 0; i < prompts->size(); ++i) {
    data::Example e = prompts->get(i);
    e.set("index", i);
    out.push_back(std::move(e));
  }
  return data::make_dataset(std::move(out));
}

std::shared_ptr<const data::Dataset> grpo_prompt_order(std::shared_ptr<const data::Dataset> prompts, int64_t global_batch,
                                                       int64_t k, uint64_t seed) {
  MT_CHECK(global_batch >= 1 && k >= 1, "[grpo] batches of ", global_batch, " prompts repeated ", k, " times");
  const int64_t batches = prompts->size() / global_batch;
  MT_CHECK(batches > 0, "[grpo] ", prompts->size(), " training prompts make no batch of ", global_batch);
  std::vector<int64_t> order(size_t(prompts->size()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<data::Example> out;
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t r = 0; r < k; ++r)
      for (int64_t i = 0; i < global_batch; ++i) out.push_back(prompts->get(order[size_t(b * global_batch + i)]));
  return data::make_dataset(std::move(out));
}

train::CollateFn prompt_index_collate() {
  return [](const std::vector<data::Example>& examples) {
    std::vector<int64_t> idx;
    for (const data::Example& e : examples) idx.push_back(e.as_int("index"));
    return train::Batch{{"index", Array::from_vector(idx, {int64_t(idx.size())})}};
  };
}

GrpoRollout::GrpoRollout(std::shared_ptr<const models::PretrainedModel> model, std::shared_ptr<const data::Dataset> prompts,
                         std::vector<RewardFunction> rewards, GrpoOptions options, const train::Deployer& deployer,
                         std::shared_ptr<const tokenizers::Tokenizer> tokenizer, std::vector<int64_t> stop_tokens,
                         GrpoReference reference)
    : model_(std::move(model)),
      prompts_(std::move(prompts)),
      rewards_(std::move(rewards)),
      options_(options),
      deployer_(deployer),
      tokenizer_(std::move(tokenizer)),
      stop_tokens_(std::move(stop_tokens)),
      reference_(std::move(reference)) {
  check_grpo_options(options_);
  MT_CHECK(!rewards_.empty(), "[grpo] no reward function");
  MT_CHECK(options_.beta == 0 || reference_.kind != GrpoReference::Kind::none,
           "[grpo] beta > 0 needs a reference (the base with adapters off, or a frozen copy)");
}

namespace {

// Doubles (or rank 0's error) to every rank, bit for bit.
void share_numbers(std::vector<double>& values, std::string& failure) {
  std::vector<int64_t> words(values.size());
  std::memcpy(words.data(), values.data(), values.size() * sizeof(double));
  share_from_rank0(words, failure);
  values.resize(words.size());
  std::memcpy(values.data(), words.data(), words.size() * sizeof(double));
}

Array scalar(double v) { return Array::from_vector(std::vector<double>{v}, {}); }

double mean_of(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return end > begin ? s / double(end - begin) : 0.0;
}

}  // namespace

std::vector<double> GrpoRollout::score(const std::vector<const data::Example*>& rows, const std::vector<std::string>& texts,
                                       std::vector<std::vector<double>>* per_function) const {
  const size_t n = texts.size(), f = rewards_.size();
  std::vector<double> flat;  // function-major: flat[k·n + i]
  std::string failure;
  if (dist::world().rank() == 0) {
    try {
      std::vector<RewardInput> in;
      for (size_t i = 0; i < n; ++i) in.push_back({field_text(*rows[i], "prompt"), texts[i], rows[i]});
      for (const RewardFunction& fn : rewards_) {
        std::vector<double> r = fn.score(in);
        MT_CHECK(r.size() == n, "[grpo] reward ", fn.name, " gave ", r.size(), " scores for ", n, " completions");
        flat.insert(flat.end(), r.begin(), r.end());
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  share_numbers(flat, failure);
  MT_CHECK(failure.empty(), failure);
  std::vector<double> total(n, 0.0);
  if (per_function) per_function->assign(f, std::vector<double>(n));
  for (size_t k = 0; k < f; ++k)
    for (size_t i = 0; i < n; ++i) {
      total[i] += flat[k * n + i];
      if (per_function) (*per_function)[k][i] = flat[k * n + i];
    }
  return total;
}

std::vector<train::Batch> GrpoRollout::operator()(const Params& params, const std::vector<train::Batch>& micro_batches,
                                                  int64_t step, const RngKey& key) {
  std::vector<std::vector<int64_t>> indices;
  for (const train::Batch& b : micro_batches) indices.push_back(dist::to_host(b["index"]).to_ints());
  // Within a group of num_iterations steps the prompts are the group's first (the data
  // repeats them: grpo's data plan); the kept rollout serves them.
  if (step % options_.num_iterations != 0 && !buffer_.empty() && indices == buffer_indices_) return buffer_;
  buffer_ = sample_and_score(params, indices, key);
  buffer_indices_ = std::move(indices);
  return buffer_;
}

SampledCompletions GrpoRollout::sample(const Params& compute, const std::vector<data::Example>& rows, int64_t n,
                                       double temperature, uint64_t seed, std::vector<std::string>& texts) const {
  std::vector<std::vector<int64_t>> prompts;
  for (const data::Example& row : rows) prompts.push_back(row.tokens("prompt_tokens"));
  SamplingOptions so;
  so.n = n;
  so.max_new_tokens = options_.max_completion_length;
  so.temperature = temperature;
  so.top_p = options_.top_p;
  so.top_k = options_.top_k;
  so.seed = seed;
  so.stop_tokens = stop_tokens_;
  so.vocab_limit = tokenizer_->vocab_size();
  SampledCompletions c;
  {
    autodiff::NoGradGuard no_grad;
    c = sample_completions(*model_, compute, prompts, so);
  }
  // The completions' text, without the stop token that ended them.
  texts.clear();
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    const size_t kept = c.tokens[i].size() - (c.stopped[i] ? 1 : 0);
    const std::vector<int32_t> ids(c.tokens[i].begin(), c.tokens[i].begin() + long(kept));
    texts.push_back(tokenizer_->decode(ids, true));
  }
  return c;
}

std::vector<train::Batch> GrpoRollout::sample_and_score(const Params& params,
                                                        const std::vector<std::vector<int64_t>>& micro_indices,
                                                        const RngKey& key) {
  const int64_t g = options_.num_generations;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<data::Example> rows;
  for (const std::vector<int64_t>& idx : micro_indices)
    for (int64_t i : idx) {
      rows.push_back(prompts_->get(i));
      prompts.push_back(rows.back().tokens("prompt_tokens"));
    }
  const Params compute = precision_policy().cast_for_compute(params);
  std::vector<std::string> texts;
  const SampledCompletions c =
      sample(compute, rows, g, options_.temperature, key.seed * 0x9E3779B97F4A7C15ull ^ key.stream, texts);
  const size_t choices = c.tokens.size();
  std::vector<const data::Example*> row_of;
  for (size_t i = 0; i < choices; ++i) row_of.push_back(&rows[i / size_t(g)]);
  std::vector<std::vector<double>> per_function;
  const std::vector<double> rewards = score(row_of, texts, &per_function);
  std::vector<double> group_std;
  const std::vector<double> advantages = group_advantages(rewards, g, &group_std);

  // Every completion as prompt + completion; inputs are all but the last token, labels the
  // next token where it is a completion token.
  size_t longest = 2;
  for (size_t i = 0; i < choices; ++i) longest = std::max(longest, prompts[i / size_t(g)].size() + c.tokens[i].size());
  const int64_t t = int64_t(longest) - 1;
  const int64_t pad = stop_tokens_.empty() ? 0 : stop_tokens_[0];
  const int64_t data_size = deployer_.data_size(), data_index = deployer_.data_index();
  std::vector<train::Batch> out;
  size_t first_prompt = 0;  // of the micro-batch, in the rollout's order
  for (const std::vector<int64_t>& idx : micro_indices) {
    const int64_t global = int64_t(idx.size());
    MT_CHECK(global % data_size == 0, "[grpo] ", global, " prompts do not split over ", data_size, " data ranks");
    const int64_t local = global / data_size;
    std::vector<int64_t> ids, labels;
    std::vector<float> adv;
    for (int64_t q = data_index * local; q < (data_index + 1) * local; ++q)
      for (int64_t j = 0; j < g; ++j) {
        const size_t choice = (first_prompt + size_t(q)) * size_t(g) + size_t(j);
        std::vector<int64_t> seq = prompts[first_prompt + size_t(q)];
        const int64_t prompt_len = int64_t(seq.size());
        seq.insert(seq.end(), c.tokens[choice].begin(), c.tokens[choice].end());
        const int64_t len = int64_t(seq.size());
        for (int64_t k = 0; k < t; ++k) {
          ids.push_back(k < len ? seq[size_t(k)] : pad);
          labels.push_back(k + 1 >= prompt_len && k + 1 < len ? seq[size_t(k + 1)] : -100);
        }
        adv.push_back(float(advantages[choice]));
      }
    const int64_t rows_here = local * g;
    train::Batch b = deployer_.shard_batch(train::Batch{{"input_ids", Array::from_vector(ids, {rows_here, t})},
                                                        {"labels", Array::from_vector(labels, {rows_here, t})},
                                                        {"advantages", Array::from_vector(adv, {rows_here})}});
    {
      autodiff::NoGradGuard no_grad;
      models::DecoderInputs in;
      in.input_ids = b["input_ids"];
      if (options_.num_iterations > 1)
        b.set("old_logps", decoder_token_logprobs(*model_, compute, in, b["labels"], RngKey{0, 0}, false, options_.temperature));
      if (options_.beta > 0) {
        const Params ref = reference_.kind == GrpoReference::Kind::frozen_copy ? reference_.frozen : without_adapters(compute);
        b.set("ref_logps", decoder_token_logprobs(*model_, ref, in, b["labels"], RngKey{0, 0}, false, options_.temperature));
      }
    }
    // This micro-batch's share of the rollout, measured over all its completions (every rank).
    const size_t begin = first_prompt * size_t(g), end = (first_prompt + idx.size()) * size_t(g);
    std::vector<double> lengths, stopped;
    for (size_t i = begin; i < end; ++i) {
      lengths.push_back(double(c.tokens[i].size()));
      stopped.push_back(c.stopped[i] ? 1.0 : 0.0);
    }
    b.set("rollout/reward", scalar(mean_of(rewards, begin, end)));
    b.set("rollout/reward_std", scalar(mean_of(group_std, first_prompt, first_prompt + idx.size())));
    for (size_t k = 0; k < rewards_.size(); ++k)
      b.set("rollout/rewards/" + rewards_[k].name, scalar(mean_of(per_function[k], begin, end)));
    b.set("rollout/completion_length", scalar(mean_of(lengths, 0, lengths.size())));
    b.set("rollout/completions_stopped", scalar(mean_of(stopped, 0, stopped.size())));
    b.set("rollout/rollout_seconds", scalar(c.seconds));
    b.set("rollout/rollout_tokens_per_s", scalar(c.seconds > 0 ? double(c.generated_tokens) / c.seconds : 0.0));
    out.push_back(std::move(b));
    first_prompt += idx.size();
  }
  return out;
}

std::map<std::string, double> GrpoRollout::evaluate(const Params& params, const data::Dataset& data) const {
  std::vector<data::Example> rows;
  for (int64_t i = 0; i < data.size(); ++i) rows.push_back(data.get(i));
  std::vector<std::string> texts;
  const SampledCompletions c = sample(precision_policy().cast_for_compute(params), rows, 1, 0.0, 0, texts);  // greedy
  std::vector<const data::Example*> row_of;
  std::vector<double> lengths;
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    row_of.push_back(&rows[i]);
    lengths.push_back(double(c.tokens[i].size()));
  }
  std::vector<std::vector<double>> per_function;
  const std::vector<double> rewards = score(row_of, texts, &per_function);
  std::map<std::string, double> out{{"eval_reward", mean_of(rewards, 0, rewards.size())},
                                    {"eval_completion_length", mean_of(lengths, 0, lengths.size())}};
  for (size_t k = 0; k < rewards_.size(); ++k)
    out["eval_rewards/" + rewards_[k].name] = mean_of(per_function[k], 0, per_function[k].size());
  return out;
}

}  // namespace mt::posttrain
