"""meshtrain.posttrain from Python: DPO's and distillation's losses and their gradients equal
PyTorch computations of their definitions, GRPO's objective and group advantages equal
NumPy's, and record_metric inside a Trainer's loss reaches metrics.jsonl and
Trainer.last_step_metrics."""
import json

import numpy as np
import torch
import torch.nn.functional as F

import meshtrain as mt


def test_dpo_loss_and_gradient_equal_torch():
    rng = np.random.default_rng(0)
    pc, pr, rc, rr = (rng.uniform(-20, -5, size=6).astype(np.float32) for _ in range(4))
    for loss, smoothing in (("sigmoid", 0.0), ("sigmoid", 0.2)):
        value, grads = mt.value_and_grad(
            lambda p: mt.posttrain.dpo_loss(p["c"], p["r"], mt.array(rc), mt.array(rr), beta=0.3, loss=loss,
                                            label_smoothing=smoothing))({"c": mt.array(pc), "r": mt.array(pr)})
        tc, tr = torch.tensor(pc, requires_grad=True), torch.tensor(pr, requires_grad=True)
        h = 0.3 * ((tc - torch.tensor(rc)) - (tr - torch.tensor(rr)))
        ref = (-(1 - smoothing) * F.logsigmoid(h) - smoothing * F.logsigmoid(-h)).mean()
        ref.backward()
        err = max(abs(value.item() - ref.item()), np.abs(np.asarray(grads["c"]) - tc.grad.numpy()).max())
        print(f"  [dpo {loss} {smoothing}] max err vs torch {err:.3g}")
        assert err < 1e-6


def test_distillation_loss_equals_torch():
    rng = np.random.default_rng(1)
    zs, zt = (rng.normal(size=(2, 5, 7)).astype(np.float32) for _ in range(2))
    labels = rng.integers(0, 7, size=(2, 5)).astype(np.int64)
    labels[0, :2] = -100
    value = mt.posttrain.distillation_loss(mt.array(zs), mt.array(zt), mt.array(labels), temperature=2.0, alpha=0.4)
    s, t = torch.tensor(zs, dtype=torch.float64), torch.tensor(zt, dtype=torch.float64)
    mask = torch.tensor(labels != -100, dtype=torch.float64)
    lpt, lps = torch.log_softmax(t / 2, -1), torch.log_softmax(s / 2, -1)
    kl = ((lpt.exp() * (lpt - lps)).sum(-1) * mask).sum() / mask.sum()
    ce = F.cross_entropy(s.reshape(-1, 7), torch.tensor(labels).reshape(-1), ignore_index=-100)
    ref = 0.4 * 4 * kl + 0.6 * ce
    assert abs(value.item() - ref.item()) < 1e-5


def test_grpo_objective_and_group_advantages_equal_numpy():
    adv = mt.posttrain.group_advantages([1.0, 0.0, 0.0, 1.0, 3.0, 3.0], 3)
    r = np.array([1.0, 0.0, 0.0, 1.0, 3.0, 3.0]).reshape(2, 3)
    want = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)
    np.testing.assert_allclose(adv, want.reshape(-1), rtol=1e-12)
    logps = np.log(np.array([[0.5, 0.4], [0.2, 0.9]], np.float32))
    old = np.log(np.array([[0.4, 0.4], [0.3, 0.6]], np.float32))
    mask = np.array([[1, 1], [1, 0]], np.float32)
    a = np.array([1.0, -1.0], np.float32)
    value = mt.posttrain.grpo_loss(mt.array(logps), mt.array(old), None, mt.array(a), mt.array(mask), beta=0.0, epsilon=0.2)
    ratio = np.exp(logps - old)
    per = -np.minimum(ratio * a[:, None], np.clip(ratio, 0.8, 1.2) * a[:, None])
    assert abs(value.item() - (per * mask).sum() / mask.sum()) < 1e-6


def test_record_metric_reaches_the_trainer_logs(tmp_path):
    rows = [{"x": np.float32(i)} for i in range(8)]

    def collate(batch):
        return {"x": np.array([r["x"] for r in batch], np.float32)}

    def loss(params, batch, key, training):
        mt.posttrain.record_metric("x/mean", mt.mean(batch["x"]))
        return mt.mean(mt.square(batch["x"] * params["w"]))

    trainer = mt.Trainer(mt.Deployer(workdir=str(tmp_path / "run"), seed=1, device="cpu", verbose=False), collate, loss,
                         {"w": np.ones(1, np.float32)}, mt.optim.sgd(0.0))
    trainer.fit(rows, per_device_batch_size=2, epochs=1, shuffle=False, grad_accum_steps=2, progress=True)
    assert trainer.last_step_metrics == {"x/mean": 5.5}  # the last step: rows 4, 5 and 6, 7
    lines = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl") if '"train"' in l]
    assert [l["x/mean"] for l in lines] == [1.5, 5.5]
