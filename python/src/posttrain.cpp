// meshtrain.posttrain: the post-training losses over arrays a user's loss function computes
// (TRL's definitions, meshtrain/posttrain/), and record_metric, which logs a scalar beside
// the loss in the Trainer's metrics.jsonl, TensorBoard and curves.svg.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "meshtrain/posttrain/distillation.h"
#include "meshtrain/posttrain/dpo.h"
#include "meshtrain/posttrain/grpo.h"
#include "meshtrain/posttrain/token_logprobs.h"
#include "meshtrain/train/step_metrics.h"
#include "python/src/bindings.h"

namespace py = pybind11;
using namespace mt;

void bind_posttrain(py::module_& m) {
  py::module_ pt = m.def_submodule("posttrain", "post-training losses (DPO, GRPO, distillation) and record_metric");
  const auto release = py::call_guard<py::gil_scoped_release>();
  pt.def("record_metric", &train::record_metric, py::arg("name"), py::arg("value"),
         "Inside a loss function the Trainer runs: log this scalar under `name` with the step (its mean over the "
         "micro-batches) and as eval_<name> in evaluations. Elsewhere: nothing.");
  pt.def("token_logprobs", &posttrain::token_logprobs, py::arg("logits"), py::arg("labels"), py::arg("temperature") = 1.0,
         release, "(B, T) log-probabilities of labels under logits (B, T, V) / temperature; 0 where labels == -100");
  pt.def("sequence_logprobs", &posttrain::sequence_logprobs, py::arg("logits"), py::arg("labels"), release,
         "(B,) sums of token_logprobs over each row's targets");
  pt.def(
      "dpo_loss",
      [](const Array& pc, const Array& pr, const Array& rc, const Array& rr, double beta, const std::string& loss,
         double label_smoothing, double rpo_alpha, const std::optional<Array>& chosen_tokens,
         const std::optional<Array>& rejected_tokens) {
        posttrain::DpoOptions o;
        o.beta = beta, o.loss = posttrain::parse_dpo_loss(loss), o.label_smoothing = label_smoothing, o.rpo_alpha = rpo_alpha;
        const Array ct = chosen_tokens.value_or(Array()), rt = rejected_tokens.value_or(Array());
        MT_CHECK((o.loss != posttrain::DpoLossType::ipo && rpo_alpha == 0) || (ct.defined() && rt.defined()),
                 "[dpo] ipo and rpo_alpha need chosen_tokens and rejected_tokens (the responses' token counts)");
        return posttrain::dpo_loss({pc, pr, ct, rt}, {rc, rr, ct, rt}, o);
      },
      py::arg("policy_chosen"), py::arg("policy_rejected"), py::arg("ref_chosen"), py::arg("ref_rejected"),
      py::arg("beta") = 0.1, py::arg("loss") = "sigmoid", py::arg("label_smoothing") = 0.0, py::arg("rpo_alpha") = 0.0,
      py::arg("chosen_tokens") = py::none(), py::arg("rejected_tokens") = py::none(), release,
      "TRL's DPO loss (sigmoid or ipo) from sequence log-probabilities (B,); records rewards/* and logps/*");
  pt.def(
      "grpo_loss",
      [](const Array& logps, const Array& old_logps, const std::optional<Array>& ref_logps, const Array& advantages,
         const Array& mask, double beta, double epsilon) {
        posttrain::GrpoOptions o;
        o.beta = beta, o.epsilon = epsilon;
        return posttrain::grpo_loss(logps, old_logps, ref_logps.value_or(Array()), advantages, mask, o);
      },
      py::arg("logps"), py::arg("old_logps"), py::arg("ref_logps"), py::arg("advantages"), py::arg("mask"),
      py::arg("beta") = 0.04, py::arg("epsilon") = 0.2, release,
      "TRL 0.16's GRPO objective over completion tokens (N, T); records kl and clip_ratio");
  pt.def("group_advantages",
         [](const std::vector<double>& rewards, int64_t group_size) { return posttrain::group_advantages(rewards, group_size); },
         py::arg("rewards"), py::arg("group_size"), "(r - group mean) / (group std + 1e-4), groups of consecutive rewards");
  pt.def(
      "distillation_loss",
      [](const Array& student, const Array& teacher, const Array& labels, double temperature, double alpha) {
        return posttrain::distillation_loss_from_logits(student, teacher, labels, {temperature, alpha});
      },
      py::arg("student_logits"), py::arg("teacher_logits"), py::arg("labels"), py::arg("temperature") = 2.0,
      py::arg("alpha") = 0.5, release,
      "alpha * T^2 * KL(teacher || student at T) + (1 - alpha) * CE per target token; records kl and ce_loss");
}
