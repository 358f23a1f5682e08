#pragma once
// GRPO's rollout step (Trainer::set_rollout): each step's prompts — examples carrying
// "prompt" (its text) and "prompt_tokens" (its ids) beside the row's own fields — get G
// completions sampled from the current policy (sampling.h), each scored by the reward
// functions (summed), advantages normalised per group, and the scored completions become the
// step's batches for grpo_loss_fn: input_ids, labels (the completion tokens), advantages,
// old_logps (num_iterations > 1) and ref_logps (β > 0), sharded over the data ranks. With
// num_iterations K one rollout serves K consecutive steps (the same prompts, kept) before
// the next is sampled; a run resumed between them samples again.
//
// Rollout metrics travel in the batches as rollout/<name> scalars: reward, reward_std (the
// mean of the groups' standard deviations), rewards/<function>, completion_length,
// completions_stopped (the share that ended with a stop token), rollout_seconds and
// rollout_tokens_per_s (generation only).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/dataset.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/posttrain/grpo.h"
#include "meshtrain/posttrain/rewards.h"
#include "meshtrain/posttrain/sampling.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/train/deployer.h"
#include "meshtrain/train/trainer.h"

namespace mt::posttrain {

// A prompt as an example: {"prompt": text, "prompt_tokens": ids} and the row's other fields.
data::Example prompt_example(const std::string& text, const std::vector<int64_t>& ids, const data::Example& row);

// Examples -> {"index": (b,) i64}: the prompts' positions in the dataset the rollout holds.
// Each example must carry its position as "index" (with_prompt_indices).
train::CollateFn prompt_index_collate();
// The dataset with each example's position added as "index".
std::shared_ptr<const data::Dataset> with_prompt_indices(std::shared_ptr<const data::Dataset> prompts);

// The prompts in the order a run with num_iterations K visits them: shuffled by `seed`, each
// global batch of `global_batch` prompts repeated K times in a row, so that consecutive steps
// train on one rollout (the Trainer then runs unshuffled). Prompts that fill no whole batch
// are left out.
std::shared_ptr<const data::Dataset> grpo_prompt_order(std::shared_ptr<const data::Dataset> prompts, int64_t global_batch,
                                                       int64_t k, uint64_t seed);

// Where the reference log-probabilities come from.
struct GrpoReference {
  enum class Kind { none, adapters_off, frozen_copy };  // none: β = 0
  Kind kind = Kind::none;
  Params frozen;  // frozen_copy: laid out and cast like the policy's compute parameters
};

class GrpoRollout {
 public:
  GrpoRollout(std::shared_ptr<const models::PretrainedModel> model, std::shared_ptr<const data::Dataset> prompts,
              std::vector<RewardFunction> rewards, GrpoOptions options, const train::Deployer& deployer,
              std::shared_ptr<const tokenizers::Tokenizer> tokenizer, std::vector<int64_t> stop_tokens,
              GrpoReference reference);

  // The rollout function of the Trainer.
  std::vector<train::Batch> operator()(const Params& params, const std::vector<train::Batch>& micro_batches, int64_t step,
                                       const RngKey& key);

  // Greedy completions (one per prompt) of `prompts` (examples as above) scored by the
  // rewards: eval_reward, eval_rewards/<function>, eval_completion_length. Every rank.
  std::map<std::string, double> evaluate(const Params& params, const data::Dataset& prompts) const;

  // Scores completions (rank 0 runs the functions; every rank gets the numbers, or every
  // rank throws the same error). rewards[i] is the sum; per_function[f][i] each function's.
  std::vector<double> score(const std::vector<const data::Example*>& rows, const std::vector<std::string>& completions,
                            std::vector<std::vector<double>>* per_function = nullptr) const;

 private:
  // The rows' prompts (prompt_tokens) sampled n times each at `temperature` (0: greedy) with
  // parameters already cast for compute, and the completions' texts.
  SampledCompletions sample(const Params& compute, const std::vector<data::Example>& rows, int64_t n, double temperature,
                            uint64_t seed, std::vector<std::string>& texts) const;
  // One rollout: the prompts of each micro-batch (dataset indices) sampled, scored, batched.
  std::vector<train::Batch> sample_and_score(const Params& params, const std::vector<std::vector<int64_t>>& micro_indices,
                                             const RngKey& key);

  std::shared_ptr<const models::PretrainedModel> model_;
  std::shared_ptr<const data::Dataset> prompts_;
  std::vector<RewardFunction> rewards_;
  GrpoOptions options_;
  const train::Deployer& deployer_;
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer_;
  std::vector<int64_t> stop_tokens_;
  GrpoReference reference_;
  std::vector<train::Batch> buffer_;  // the last rollout, reused for num_iterations steps
  std::vector<std::vector<int64_t>> buffer_indices_;
};

}  // namespace mt::posttrain
