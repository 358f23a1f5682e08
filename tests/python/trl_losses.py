"""Hugging Face TRL's own loss functions as the oracle of meshtrain's post-training losses
(tests/oracle/posttrain_oracle_test.cpp), called on fixed tensors without a model:

  trl_losses.py dpo  IN.json   DPOTrainer.dpo_loss: per-pair losses, chosen/rejected rewards,
                               and the gradient of their mean w.r.t. the policy log-probs
  trl_losses.py grpo IN.json   GRPOTrainer.compute_loss with the per-token log-probabilities
                               given: the loss, its gradient w.r.t. them, kl and clip_ratio

IN.json holds the tensors as nested lists and the options; the answer is one JSON object on
stdout. Run with the project's .venv python (trl 0.16.1 pinned in requirements.txt).
"""
import json
import sys
import types
from collections import defaultdict

import torch
from trl import DPOTrainer, GRPOTrainer


def t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def dpo(cfg):
    # The attributes dpo_loss reads for the sigmoid and ipo losses.
    fake = types.SimpleNamespace(beta=cfg["beta"], loss_type=cfg["loss_type"], label_smoothing=cfg["label_smoothing"],
                                 reference_free=False, f_divergence_type="reverse_kl", f_divergence_params=None,
                                 accelerator=types.SimpleNamespace(device=torch.device("cpu")))
    pc, pr = t(cfg["policy_chosen"], True), t(cfg["policy_rejected"], True)
    losses, chosen_rewards, rejected_rewards = DPOTrainer.dpo_loss(fake, pc, pr, t(cfg["ref_chosen"]), t(cfg["ref_rejected"]))
    losses.mean().backward()
    return {"losses": losses.tolist(), "chosen_rewards": chosen_rewards.tolist(),
            "rejected_rewards": rejected_rewards.tolist(), "grad_chosen": pc.grad.tolist(),
            "grad_rejected": pr.grad.tolist()}


def grpo(cfg):
    logps = t(cfg["per_token_logps"], True)
    metrics = defaultdict(lambda: defaultdict(list))
    fake = types.SimpleNamespace(
        beta=cfg["beta"], epsilon_low=cfg["epsilon"], epsilon_high=cfg["epsilon"], num_iterations=cfg["num_iterations"],
        _metrics=metrics, control=types.SimpleNamespace(should_evaluate=False),
        args=types.SimpleNamespace(report_to=[]),  # the profiling decorator asks
        accelerator=types.SimpleNamespace(gather_for_metrics=lambda x: x, is_main_process=True),
        # The model's forward is replaced by the log-probabilities under test.
        _get_per_token_logps=lambda model, ids, mask, keep: logps)
    completion_mask = t(cfg["completion_mask"])
    b, n = completion_mask.shape
    inputs = {"prompt_ids": torch.zeros((b, 1), dtype=torch.long), "prompt_mask": torch.ones((b, 1), dtype=torch.long),
              "completion_ids": torch.zeros((b, n), dtype=torch.long), "completion_mask": completion_mask,
              "ref_per_token_logps": t(cfg["ref_per_token_logps"]), "advantages": t(cfg["advantages"]),
              "old_per_token_logps": t(cfg["old_per_token_logps"])}
    loss = GRPOTrainer.compute_loss(fake, None, inputs)
    loss.backward()
    out = {"loss": loss.item(), "grad": logps.grad.tolist()}
    for k, v in metrics["train"].items():
        out[k] = v[-1]
    return out


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        cfg = json.load(f)
    print(json.dumps({"dpo": dpo, "grpo": grpo}[mode](cfg)))
