#pragma once
// Direct preference optimisation (Rafailov et al. 2023) and IPO (Azar et al. 2023), as
// Hugging Face TRL's DPOTrainer defines them, so that runs compare: with h the policy's
// log-ratio margin over the reference,
//   h = (log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x)),
//   sigmoid: −(1−ε)·log σ(β·h) − ε·log σ(−β·h)   (ε: label smoothing, conservative DPO)
//   ipo:     (h − 1/(2β))²  with log-probabilities averaged over each response's tokens,
// each a mean over the pairs of the batch. Sequence log-probabilities sum over the response
// tokens only (the prompt and the padding are no targets).
//
// The reference is the policy before training, held one of three ways (DpoReference): with
// LoRA the base itself — the same parameters with the adapters left out, no second copy;
// without, a frozen copy laid out by the same sharding plan; or its log-probabilities
// computed once over the data before training and stored in the examples
// (with_reference_logps), after which no copy is held at all.
//
// The loss records TRL's metrics (train/step_metrics.h): rewards/chosen, rewards/rejected
// (β times the policy/reference log-ratio of each response, means over the pairs),
// rewards/accuracies (the share of pairs whose chosen reward is the larger),
// rewards/margins, logps/chosen and logps/rejected (and nll_loss with RPO).
#include <memory>
#include <string>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/array.h"
#include "meshtrain/data/dataset.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/train/deployer.h"
#include "meshtrain/train/trainer.h"

namespace mt::posttrain {

enum class DpoLossType { sigmoid, ipo };
DpoLossType parse_dpo_loss(const std::string& name);  // "sigmoid" | "ipo", else mt::Error
const char* dpo_loss_name(DpoLossType type);

struct DpoOptions {
  double beta = 0.1;
  DpoLossType loss = DpoLossType::sigmoid;
  double label_smoothing = 0.0;  // sigmoid only: the assumed share of flipped preferences
  // RPO (Pang et al. 2024, TRL's rpo_alpha): adds alpha times the policy's mean negative
  // log-likelihood of the chosen responses' tokens, so that the chosen answers do not lose
  // likelihood while the margin grows. 0: off.
  double rpo_alpha = 0.0;
  // Dropout in the policy while training (TRL's disable_dropout turns it off by default, so
  // the first step compares equal models).
  bool dropout = false;
};
// Throws naming the option: β <= 0, label smoothing outside [0, 0.5), smoothing with IPO,
// a negative RPO alpha.
void check_dpo_options(const DpoOptions& options);

// Sequence log-probabilities (B,) of the chosen and rejected responses, and their target
// token counts (B,) (IPO averages by them).
struct PairLogps {
  Array chosen, rejected;
  Array chosen_tokens, rejected_tokens;
};

// The mean loss over the pairs from the policy's and the reference's log-probabilities;
// records the metrics above. The reference's are constants (no gradient flows into them).
Array dpo_loss(const PairLogps& policy, const PairLogps& reference, const DpoOptions& options);

struct DpoReference {
  enum class Kind { adapters_off, frozen_copy, precomputed };
  Kind kind = Kind::adapters_off;
  Params frozen;  // frozen_copy: the reference's parameters, in the policy's layout and compute dtype
  // A copy of `params` laid out by `plan` (when given) and cast to the compute dtype.
  static DpoReference frozen_copy(const Params& params, const train::ShardingPlan* plan);
};

// The loss function of the Trainer. Batches come from preference_collate (preference_data.h):
// chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels (B, T), and with a
// precomputed reference ref_chosen_logps, ref_rejected_logps (+ token counts) (B,).
train::LossFn dpo_loss_fn(std::shared_ptr<const models::PretrainedModel> model, DpoReference reference,
                          DpoOptions options);

// The log-probabilities of the chosen and rejected responses of one batch (no gradient),
// under parameters `p` (the reference: the base model, adapters left out when `adapters_off`).
PairLogps pair_logps(const models::PretrainedModel& model, const Params& p, const train::Batch& batch,
                     const RngKey& key, bool train);

// Every example of `data` with its reference log-probabilities added (ref_chosen_logp,
// ref_rejected_logp and the token counts), computed under `params` (any layout; with LoRA
// the adapters are left out) by a Predictor in batches of per_device_batch_size per data
// rank (collated by preference_collate(pad_multiple)). The result lives in memory beside the
// examples.
std::shared_ptr<const data::Dataset> with_reference_logps(std::shared_ptr<const data::Dataset> data,
                                                          const models::PretrainedModel& model, const Params& params,
                                                          train::Deployer& deployer, int64_t per_device_batch_size,
                                                          int64_t pad_multiple = 0);

// The parameters without their LoRA adapters: the base model a LoRA policy started from.
Params without_adapters(const Params& p);

}  // namespace mt::posttrain
