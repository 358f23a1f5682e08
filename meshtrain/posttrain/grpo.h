#pragma once
// Group relative policy optimisation (Shao et al. 2024) as Hugging Face TRL 0.16 defines it,
// so that runs compare. For each prompt G completions are sampled from the current policy and
// scored; each completion's advantage is its reward normalised within its group,
//   A = (r − mean_group) / (std_group + 1e-4)      (std: the unbiased estimate, as torch's),
// and every completion token t contributes
//   −min(ρ_t·A, clip(ρ_t, 1−ε, 1+ε)·A) + β·(e^{ref_t − logp_t} − (ref_t − logp_t) − 1),
// ρ_t = e^{logp_t − old_t}: the ratio to the policy that sampled (old_t = logp_t, detached,
// when each rollout trains one step), the KL to the reference by the k3 estimator. The loss
// is the mean over every completion token of the batch (TRL 0.16's token-level mean).
// Log-probabilities are of the logits divided by the sampling temperature.
//
// The loss records kl (the mean per-token k3 estimate, with β > 0) and clip_ratio (the share
// of completion tokens whose clipped term was the smaller).
#include <memory>
#include <vector>

#include "meshtrain/core/array.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/train/trainer.h"

namespace mt::posttrain {

struct GrpoOptions {
  int64_t num_generations = 8;         // G: completions per prompt
  int64_t max_completion_length = 64;  // new tokens per completion at most
  double temperature = 0.9;            // sampling (and scoring) temperature
  double top_p = 1.0;
  int64_t top_k = 0;
  double beta = 0.04;     // the KL term's weight (0: no reference held)
  double epsilon = 0.2;   // the ratio's clip range
  int64_t num_iterations = 1;  // optimizer steps per batch of rollouts
  bool dropout = false;   // dropout in the policy while training (off, as the first step compares equal models)
};
// Throws naming the option: G < 2, lengths < 1, temperature <= 0, top_p outside (0, 1],
// beta < 0, epsilon outside (0, 1), num_iterations < 1.
void check_grpo_options(const GrpoOptions& options);

// The objective above from per-token log-probabilities (N, T) of the policy (with gradient),
// of the sampling policy and of the reference (constants; ref undefined when β = 0),
// advantages (N,) and the completion mask (N, T) (1 on completion tokens).
Array grpo_loss(const Array& logps, const Array& old_logps, const Array& ref_logps, const Array& advantages,
                const Array& mask, const GrpoOptions& options);

// Advantages of rewards laid out group after group (G consecutive completions per prompt);
// `group_std` receives each group's standard deviation when given.
std::vector<double> group_advantages(const std::vector<double>& rewards, int64_t group_size,
                                     std::vector<double>* group_std = nullptr);

// The Trainer's loss over rollout batches (grpo_rollout.h): input_ids, labels (the completion
// tokens; -100 elsewhere), advantages, and when needed old_logps / ref_logps (N, T); the
// batch's rollout metrics (scalars named "rollout/<metric>") are recorded as <metric>.
train::LossFn grpo_loss_fn(std::shared_ptr<const models::PretrainedModel> model, GrpoOptions options);

}  // namespace mt::posttrain
