#include "meshtrain/posttrain/distillation.h"

#include <algorithm>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/autodiff/remat.h"
#include "meshtrain/core/error.h"
#include "meshtrain/models/chunked_lm_loss.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/ops/nn_ops.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/posttrain/token_logprobs.h"
#include "meshtrain/train/step_metrics.h"

namespace mt::posttrain {

void check_distill_options(const DistillOptions& o) {
  MT_CHECK(o.temperature > 0, "[distill] the temperature must be positive, got ", o.temperature);
  MT_CHECK(o.alpha >= 0 && o.alpha <= 1, "[distill] alpha must be in [0, 1], got ", o.alpha);
}

void check_teacher(const models::PretrainedModel& teacher, const models::PretrainedModel& student) {
  MT_CHECK(teacher.is_causal_lm(), "[distill] the teacher ", teacher.source, " (", teacher.model_type,
           ") is not a decoder");
  MT_CHECK(student.is_causal_lm(), "[distill] the student ", student.source, " (", student.model_type,
           ") is not a decoder");
  const int64_t tv = teacher.causal_lm().vocab_size, sv = student.causal_lm().vocab_size;
  MT_CHECK(tv == sv, "[distill] the teacher ", teacher.source, " has a vocabulary of ", tv, " ids and the student ",
           student.source.empty() ? std::string("(new)") : student.source, " one of ", sv,
           ": their logits must line up token for token (distil into a student with the teacher's tokenizer)");
}

namespace {

// The decoder's final hidden states and the parameters of its output head.
struct HeadInput {
  Array hidden;
  Params head;
};

HeadInput head_input(const models::PretrainedModel& m, const Params& p, const models::DecoderInputs& in,
                     const RngKey& key, bool train) {
  const models::ModelSpec& s = m.spec();
  return {s.decoder_hidden(m.config, p, in, key, train), models::head_params_of(s.head_prefixes, p)};
}

}  // namespace

namespace {

// Sums over the target tokens of (B, Tc, V) logits: [KL(p_t ‖ p_s) at temperature T, CE].
Array soft_and_hard_sums(const Array& student_logits, const Array& teacher_logits, const Array& labels, double temp) {
  const Array mask = target_mask(labels);
  const Array zs = cast(student_logits, DType::f32);
  Array log_pt;
  {
    autodiff::NoGradGuard no_grad;
    const Array zt = cast(teacher_logits.detach(), DType::f32);
    log_pt = log_softmax(div(zt, scalar_like(zt, temp)), -1);
  }
  const Array log_ps = log_softmax(div(zs, scalar_like(zs, temp)), -1);
  const Array kl = sum(mul(exp(log_pt), sub(log_pt, log_ps)), {2});  // (B, Tc)
  const Array ce = cross_entropy(zs, labels, -100, 0.0, Reduction::sum);
  return stack({sum(mul(kl, mask)), ce}, 0);
}

// The loss from the summed terms; records kl and ce_loss.
Array mix(const Array& sums, const Array& labels, const DistillOptions& o) {
  const Array count = sum(target_mask(labels));
  const Array kl = div(slice(sums, 0, 0, 1), count), ce = div(slice(sums, 0, 1, 2), count);
  train::record_metric("kl", kl);
  train::record_metric("ce_loss", ce);
  const Array soft = mul(kl, scalar_like(kl, o.alpha * o.temperature * o.temperature));
  return reshape(add(soft, mul(ce, scalar_like(ce, 1.0 - o.alpha))), {});
}

}  // namespace

Array distillation_loss_from_logits(const Array& student_logits, const Array& teacher_logits, const Array& labels,
                                    const DistillOptions& o) {
  check_distill_options(o);
  MT_CHECK(student_logits.shape() == teacher_logits.shape(), "[distill] student logits ", student_logits.shape().str(),
           " and teacher logits ", teacher_logits.shape().str(), " differ");
  return mix(soft_and_hard_sums(student_logits, teacher_logits, labels, o.temperature), labels, o);
}

Array distillation_loss(const models::PretrainedModel& student, const Params& p, const models::PretrainedModel& teacher,
                        const Params& teacher_params, const models::DecoderInputs& in, const Array& labels,
                        const RngKey& dropout_key, bool train, const DistillOptions& o, int64_t chunk_logits) {
  check_distill_options(o);
  HeadInput t;
  {
    autodiff::NoGradGuard no_grad;
    t = head_input(teacher, teacher_params, in, RngKey{0, 0}, false);
  }
  const HeadInput s = head_input(student, p, in, dropout_key, train);
  const int64_t n = s.hidden.dim(1);
  const int64_t positions = models::head_chunk_positions(
      s.hidden.dim(0), n, std::max(models::head_vocab(s.head), models::head_vocab(t.head)), chunk_logits);
  const models::ModelSpec& ss = student.spec();
  const models::ModelSpec& ts = teacher.spec();
  const models::ModelConfig sc = student.config, tc = teacher.config;
  const Params teacher_head = t.head;
  const double temp = o.temperature;
  // One chunk's sums; the teacher's head runs inside without gradients.
  auto chunk = [&ss, &ts, sc, tc, teacher_head, temp, dropout_key, train](const Params& hp, const std::vector<Array>& xs) {
    Array zt;
    {
      autodiff::NoGradGuard no_grad;
      zt = ts.decoder_head(tc, teacher_head, xs[1], RngKey{0, 0}, false);
    }
    return soft_and_hard_sums(ss.decoder_head(sc, hp, xs[0], dropout_key, train), zt, xs[2], temp);
  };
  Array total;
  for (int64_t t0 = 0; t0 < n; t0 += positions) {
    const int64_t t1 = std::min(n, t0 + positions);
    Array part = checkpoint(chunk, s.head, {slice(s.hidden, 1, t0, t1), slice(t.hidden, 1, t0, t1), slice(labels, 1, t0, t1)});
    total = total.defined() ? add(total, part) : part;
  }
  return mix(total, labels, o);
}

train::LossFn distillation_loss_fn(std::shared_ptr<const models::PretrainedModel> student,
                                   std::shared_ptr<const models::PretrainedModel> teacher, Params teacher_params,
                                   DistillOptions o) {
  check_distill_options(o);
  check_teacher(*teacher, *student);
  auto tp = std::make_shared<const Params>(std::move(teacher_params));
  return [student, teacher, tp, o](const Params& p, const train::Batch& b, const RngKey& key, bool training) {
    models::DecoderInputs in;
    in.input_ids = b["input_ids"];
    return distillation_loss(*student, p, *teacher, *tp, in, b["labels"], key, training, o);
  };
}

}  // namespace mt::posttrain
