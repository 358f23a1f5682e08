#include "meshtrain/posttrain/grpo.h"

#include <cmath>

#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/posttrain/token_logprobs.h"
#include "meshtrain/train/step_metrics.h"

namespace mt::posttrain {

void check_grpo_options(const GrpoOptions& o) {
  MT_CHECK(o.num_generations >= 2, "[grpo] num_generations must be at least 2 (advantages compare a group), got ",
           o.num_generations);
  MT_CHECK(o.max_completion_length >= 1, "[grpo] max_completion_length must be at least 1, got ", o.max_completion_length);
  MT_CHECK(o.temperature > 0, "[grpo] the temperature must be positive, got ", o.temperature);
  MT_CHECK(o.top_p > 0 && o.top_p <= 1, "[grpo] top_p must be in (0, 1], got ", o.top_p);
  MT_CHECK(o.beta >= 0, "[grpo] beta must be >= 0, got ", o.beta);
  MT_CHECK(o.epsilon > 0 && o.epsilon < 1, "[grpo] epsilon must be in (0, 1), got ", o.epsilon);
  MT_CHECK(o.num_iterations >= 1, "[grpo] num_iterations must be at least 1, got ", o.num_iterations);
}

Array grpo_loss(const Array& logps, const Array& old_logps, const Array& ref_logps, const Array& advantages,
                const Array& mask, const GrpoOptions& o) {
  MT_CHECK(logps.ndim() == 2 && old_logps.shape() == logps.shape() && mask.shape() == logps.shape() &&
               advantages.ndim() == 1 && advantages.dim(0) == logps.dim(0),
           "[grpo] log-probabilities ", logps.shape().str(), ", old ", old_logps.shape().str(), ", mask ",
           mask.shape().str(), " and advantages ", advantages.shape().str(), " must be (N, T), (N, T), (N, T) and (N,)");
  const Array m = cast(mask, DType::f32);
  const Array count = sum(m);
  const Array a = expand_dims(cast(advantages, DType::f32).detach(), 1);
  const Array ratio = exp(sub(logps, old_logps.detach()));
  const Array clipped = minimum(maximum(ratio, scalar_like(ratio, 1.0 - o.epsilon)), scalar_like(ratio, 1.0 + o.epsilon));
  const Array term1 = mul(ratio, a), term2 = mul(clipped, a);
  Array per_token = neg(minimum(term1, term2));
  if (o.beta > 0) {
    MT_CHECK(ref_logps.defined() && ref_logps.shape() == logps.shape(), "[grpo] beta > 0 needs reference log-probabilities of ",
             logps.shape().str());
    const Array d = sub(ref_logps.detach(), logps);
    const Array kl = sub(sub(exp(d), d), scalar_like(d, 1.0));
    per_token = add(per_token, mul(kl, scalar_like(kl, o.beta)));
    train::record_metric("kl", div(sum(mul(kl.detach(), m)), count));
  }
  // TRL counts a token as clipped where the unclipped term is the smaller one.
  train::record_metric("clip_ratio", div(sum(mul(cast(lt(term1.detach(), term2.detach()), DType::f32), m)), count));
  return div(sum(mul(per_token, m)), count);
}

std::vector<double> group_advantages(const std::vector<double>& rewards, int64_t g, std::vector<double>* group_std) {
  MT_CHECK(g >= 2 && int64_t(rewards.size()) % g == 0, "[grpo] ", rewards.size(), " rewards do not form groups of ", g);
  std::vector<double> adv(rewards.size());
  if (group_std) group_std->clear();
  for (size_t start = 0; start < rewards.size(); start += size_t(g)) {
    double mean = 0;
    for (int64_t j = 0; j < g; ++j) mean += rewards[start + size_t(j)];
    mean /= double(g);
    double var = 0;
    for (int64_t j = 0; j < g; ++j) var += (rewards[start + size_t(j)] - mean) * (rewards[start + size_t(j)] - mean);
    const double sd = std::sqrt(var / double(g - 1));
    if (group_std) group_std->push_back(sd);
    for (int64_t j = 0; j < g; ++j) adv[start + size_t(j)] = (rewards[start + size_t(j)] - mean) / (sd + 1e-4);
  }
  return adv;
}

train::LossFn grpo_loss_fn(std::shared_ptr<const models::PretrainedModel> model, GrpoOptions o) {
  check_grpo_options(o);
  return [model, o](const Params& p, const train::Batch& b, const RngKey& key, bool training) {
    models::DecoderInputs in;
    in.input_ids = b["input_ids"];
    const Array& labels = b["labels"];
    const Array logps = decoder_token_logprobs(*model, p, in, labels, key, training && o.dropout, o.temperature);
    const Array old = b.contains("old_logps") ? b["old_logps"] : logps.detach();
    const Array ref = o.beta > 0 ? b["ref_logps"] : Array();
    for (const auto& [path, v] : b)
      if (path.rfind("rollout/", 0) == 0) train::record_metric(path.substr(8), v);
    return grpo_loss(logps, old, ref, b["advantages"], target_mask(labels), o);
  };
}

}  // namespace mt::posttrain
