#pragma once
// Knowledge distillation (Hinton et al. 2015) of a decoder into another that shares its
// tokenizer: per target token,
//   loss = alpha · T² · KL(softmax(z_t / T) ‖ softmax(z_s / T)) + (1 − alpha) · CE(z_s, label),
// z_t the teacher's logits (run without gradients), z_s the student's, T the temperature
// (the T² keeps the soft term's gradient scale independent of T), averaged over the target
// tokens (labels != -100). The output heads of both run over chunks of positions, each chunk
// recomputed in the backward pass, so neither model's (B·T, V) logits exist whole: the
// teacher may be much larger than the student, and its vocabulary large.
//
// The loss records ce_loss (the hard-label cross-entropy, comparable with an undistilled
// run's loss) and kl (the mean per-token KL at temperature T).
#include <memory>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/array.h"
#include "meshtrain/models/chunked_lm_loss.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/train/trainer.h"

namespace mt::posttrain {

struct DistillOptions {
  double temperature = 2.0;
  double alpha = 0.5;  // the soft term's share; 0: hard labels only
};
// Throws naming the option: T <= 0, alpha outside [0, 1].
void check_distill_options(const DistillOptions& options);

// Throws unless the teacher and the student are decoders over the same vocabulary (the same
// vocab_size: logits must line up token for token).
void check_teacher(const models::PretrainedModel& teacher, const models::PretrainedModel& student);

// The same loss from whole logits (B, T, V) of the student and the teacher (a constant): the
// unchunked definition, for small models and for checking the chunked path.
Array distillation_loss_from_logits(const Array& student_logits, const Array& teacher_logits, const Array& labels,
                                    const DistillOptions& options);

// The loss of student parameters `p` on decoder inputs and labels (B, T), the teacher's
// parameters `teacher_params` constants. Positions per chunk: at most chunk_logits logits
// of the wider vocabulary at once.
Array distillation_loss(const models::PretrainedModel& student, const Params& p, const models::PretrainedModel& teacher,
                        const Params& teacher_params, const models::DecoderInputs& in, const Array& labels,
                        const RngKey& dropout_key, bool train, const DistillOptions& options,
                        int64_t chunk_logits = models::kChunkLogits);

// The Trainer's loss function over lm_collate-style batches {"input_ids", "labels"}; the
// teacher's parameters are held (laid out and cast by the caller).
train::LossFn distillation_loss_fn(std::shared_ptr<const models::PretrainedModel> student,
                                   std::shared_ptr<const models::PretrainedModel> teacher, Params teacher_params,
                                   DistillOptions options);

}  // namespace mt::posttrain
