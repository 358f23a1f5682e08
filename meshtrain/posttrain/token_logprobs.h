#pragma once
// Log-probabilities of given tokens under a decoder: what every post-training method scores
// (DPO's sequence log-likelihoods, GRPO's ratios against the rollout policy and its KL to the
// reference). log p(label) = logit[label] − logsumexp(logits), computed in f32 whatever the
// compute dtype; positions whose label is -100 (prompts, padding) are 0.
#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/models/pretrained.h"

namespace mt::posttrain {

// (B, T) f32 log-probabilities of labels (B, T) under logits (B, T, V) divided by
// `temperature` (the sampling temperature, as GRPO scores its samples); 0 where label == -100.
// Labels are checked like take_along_axis checks its indices.
Array token_logprobs(const Array& logits, const Array& labels, double temperature = 1.0);

// (B,) sums of token_logprobs over each row's targets.
Array sequence_logprobs(const Array& logits, const Array& labels);

// 1 where labels != -100, 0 elsewhere, as f32 (B, T): the mask the per-token methods average with.
Array target_mask(const Array& labels);

// token_logprobs of `model` with parameters `p` (any layout of the model's, sharded ones
// too) on `in`, labels aligned with the inputs (label t is the token after input t). With
// config.remat() == full the head runs over recomputed chunks of positions, so (B, T, V)
// logits never exist whole (as chunked_lm_loss does for the cross-entropy).
Array decoder_token_logprobs(const models::PretrainedModel& model, const Params& p, const models::DecoderInputs& in,
                             const Array& labels, const RngKey& dropout_key, bool train, double temperature = 1.0);

}  // namespace mt::posttrain
