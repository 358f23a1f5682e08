#include "meshtrain/posttrain/dpo.h"

#include <array>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/autodiff/precision_policy.h"
#include "meshtrain/core/error.h"
#include "meshtrain/models/lora.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/posttrain/preference_data.h"
#include "meshtrain/posttrain/token_logprobs.h"
#include "meshtrain/train/predictor.h"
#include "meshtrain/train/step_metrics.h"

namespace mt::posttrain {

DpoLossType parse_dpo_loss(const std::string& name) {
  if (name == "sigmoid") return DpoLossType::sigmoid;
  if (name == "ipo") return DpoLossType::ipo;
  throw Error(detail::concat("[dpo] unknown loss '", name, "' (sigmoid, ipo)"));
}

const char* dpo_loss_name(DpoLossType type) { return type == DpoLossType::ipo ? "ipo" : "sigmoid"; }

void check_dpo_options(const DpoOptions& o) {
  MT_CHECK(o.beta > 0, "[dpo] beta must be positive, got ", o.beta);
  MT_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 0.5, "[dpo] label smoothing must be in [0, 0.5), got ",
           o.label_smoothing);
  MT_CHECK(o.loss == DpoLossType::sigmoid || o.label_smoothing == 0, "[dpo] label smoothing applies to the sigmoid loss, not ",
           dpo_loss_name(o.loss));
  MT_CHECK(o.rpo_alpha >= 0, "[dpo] rpo_alpha must be >= 0, got ", o.rpo_alpha);
}

namespace {

// log σ(x) = min(x, 0) − log(1 + e^−|x|): no overflow for either sign.
Array log_sigmoid(const Array& x) {
  return sub(minimum(x, zeros_like(x)), log(add(exp(neg(abs(x))), scalar_like(x, 1.0))));
}

// IPO compares mean per-token log-probabilities (TRL divides each sum by its token count).
PairLogps per_token_means(const PairLogps& l) {
  PairLogps m = l;
  m.chosen = div(l.chosen, l.chosen_tokens);
  m.rejected = div(l.rejected, l.rejected_tokens);
  return m;
}

}  // namespace

Array dpo_loss(const PairLogps& policy_sums, const PairLogps& reference_sums, const DpoOptions& o) {
  check_dpo_options(o);
  const bool ipo = o.loss == DpoLossType::ipo;
  const PairLogps policy = ipo ? per_token_means(policy_sums) : policy_sums;
  const PairLogps ref = ipo ? per_token_means(reference_sums) : reference_sums;
  const Array ref_chosen = ref.chosen.detach(), ref_rejected = ref.rejected.detach();
  const Array chosen_ratio = sub(policy.chosen, ref_chosen), rejected_ratio = sub(policy.rejected, ref_rejected);
  const Array h = sub(chosen_ratio, rejected_ratio);
  Array losses;
  if (ipo) {
    losses = square(sub(h, scalar_like(h, 1.0 / (2.0 * o.beta))));
  } else {
    const Array bh = mul(h, scalar_like(h, o.beta));
    losses = neg(mul(log_sigmoid(bh), scalar_like(bh, 1.0 - o.label_smoothing)));
    if (o.label_smoothing > 0) losses = sub(losses, mul(log_sigmoid(neg(bh)), scalar_like(bh, o.label_smoothing)));
  }
  // TRL's metrics: rewards are β·log-ratios, detached.
  const Array chosen_rewards = mul(chosen_ratio.detach(), scalar_like(h, o.beta));
  const Array rejected_rewards = mul(rejected_ratio.detach(), scalar_like(h, o.beta));
  train::record_metric("rewards/chosen", mean(chosen_rewards));
  train::record_metric("rewards/rejected", mean(rejected_rewards));
  train::record_metric("rewards/accuracies", mean(cast(gt(chosen_rewards, rejected_rewards), DType::f32)));
  train::record_metric("rewards/margins", mean(sub(chosen_rewards, rejected_rewards)));
  train::record_metric("logps/chosen", mean(policy.chosen.detach()));
  train::record_metric("logps/rejected", mean(policy.rejected.detach()));
  Array loss = mean(losses);
  if (o.rpo_alpha > 0) {
    // TRL's nll_loss: the cross-entropy of the chosen responses, a mean over all their tokens.
    const Array nll = neg(div(sum(policy_sums.chosen), sum(policy_sums.chosen_tokens)));
    train::record_metric("nll_loss", nll.detach());
    loss = add(loss, mul(nll, scalar_like(nll, o.rpo_alpha)));
  }
  return loss;
}

DpoReference DpoReference::frozen_copy(const Params& params, const train::ShardingPlan* plan) {
  DpoReference r;
  r.kind = Kind::frozen_copy;
  // Storage of its own (not the policy's, which is updated in place): laid out first, so that
  // only what the layout did not copy already (replicated arrays) is cloned — no transient
  // whole copy of the model beside its shards.
  Params laid = plan ? plan->shard(params) : params;
  for (auto& [path, a] : laid)
    if (a.shares_storage(params[path])) {
      Params one;
      one.set(path, params[path].clone());
      a = plan ? plan->shard(one)[path] : one[path];
    }
  r.frozen = precision_policy().cast_for_compute(laid);
  return r;
}

Params without_adapters(const Params& p) {
  Params base;
  for (const auto& [path, a] : p)
    if (!models::is_lora_path(path)) base.set(path, a);
  return base;
}

PairLogps pair_logps(const models::PretrainedModel& model, const Params& p, const train::Batch& b, const RngKey& key,
                     bool train) {
  PairLogps out;
  for (const char* side : {"chosen", "rejected"}) {
    const std::string s = side;
    models::DecoderInputs in;
    in.input_ids = b[s + "_input_ids"];
    const Array& labels = b[s + "_labels"];
    const Array sums = sum(decoder_token_logprobs(model, p, in, labels, key.fold_in(s == "chosen" ? 0 : 1), train), {1});
    const Array tokens = sum(target_mask(labels), {1});
    (s == "chosen" ? out.chosen : out.rejected) = sums;
    (s == "chosen" ? out.chosen_tokens : out.rejected_tokens) = tokens;
  }
  return out;
}

train::LossFn dpo_loss_fn(std::shared_ptr<const models::PretrainedModel> model, DpoReference reference, DpoOptions o) {
  check_dpo_options(o);
  MT_CHECK(reference.kind != DpoReference::Kind::adapters_off || model->config.lora().enabled(),
           "[dpo] the reference is the base model with its adapters left out, but ", model->source,
           " has no LoRA adapters (add them, or use a frozen copy or precomputed reference)");
  auto ref = std::make_shared<const DpoReference>(std::move(reference));
  return [model, ref, o](const Params& p, const train::Batch& b, const RngKey& key, bool training) {
    const PairLogps policy = pair_logps(*model, p, b, key, training && o.dropout);
    PairLogps reference;
    if (ref->kind == DpoReference::Kind::precomputed) {
      MT_CHECK(b.contains("ref_chosen_logps"), "[dpo] the batch has no ref_chosen_logps: precompute them with with_reference_logps");
      reference = {b["ref_chosen_logps"], b["ref_rejected_logps"], b["ref_chosen_tokens"], b["ref_rejected_tokens"]};
    } else {
      autodiff::NoGradGuard no_grad;
      reference = pair_logps(*model, ref->kind == DpoReference::Kind::frozen_copy ? ref->frozen : without_adapters(p), b,
                             key, false);
    }
    return dpo_loss(policy, reference, o);
  };
}

std::shared_ptr<const data::Dataset> with_reference_logps(std::shared_ptr<const data::Dataset> dataset,
                                                          const models::PretrainedModel& model, const Params& params,
                                                          train::Deployer& deployer, int64_t per_device_batch_size,
                                                          int64_t pad_multiple) {
  MT_CHECK(dataset && dataset->size() > 0, "[dpo] no preference pairs to score with the reference");
  // The Predictor walks the data as evaluation does (sharded batches, the tail padded) and
  // brings each pair's four numbers back in order, in the compute dtype's precision.
  const Params ref = without_adapters(params);
  train::Predictor<std::array<double, 4>> predictor(
      deployer, preference_collate(pad_multiple),
      [&model](const Params& p, const train::Batch& b) {
        const PairLogps l = pair_logps(model, p, b, RngKey{0, 0}, false);
        return train::Batch{{"c", l.chosen}, {"r", l.rejected}, {"ct", l.chosen_tokens}, {"rt", l.rejected_tokens}};
      },
      [](const train::Batch& out) {
        const std::vector<double> c = out["c"].to_doubles(), r = out["r"].to_doubles(), ct = out["ct"].to_doubles(),
                                  rt = out["rt"].to_doubles();
        std::vector<std::array<double, 4>> rows;
        for (size_t i = 0; i < c.size(); ++i) rows.push_back({c[i], r[i], ct[i], rt[i]});
        return rows;
      });
  if (pad_multiple > 0) predictor.set_padded_fields(preference_padded_fields());
  const std::vector<std::array<double, 4>> scores = predictor.predict(ref, dataset, per_device_batch_size);
  std::vector<data::Example> out;
  out.reserve(scores.size());
  for (int64_t i = 0; i < dataset->size(); ++i) {
    data::Example e = dataset->get(i);
    const std::array<double, 4>& s = scores[size_t(i)];
    e.set("ref_chosen_logp", s[0]);
    e.set("ref_rejected_logp", s[1]);
    e.set("ref_chosen_tokens", s[2]);
    e.set("ref_rejected_tokens", s[3]);
    out.push_back(std::move(e));
  }
  return data::make_dataset(std::move(out));
}

}  // namespace mt::posttrain
