"""mt.Trainer over Python collate/loss functions: the steps equal a hand-written loop of
value_and_grad and SGD on the same batches (bit for bit), metrics.jsonl and checkpoints are
written as the C++ Trainer writes them, resume continues, and a Python exception inside the
user's functions surfaces as itself."""
import json
import os

import numpy as np
import pytest

import meshtrain as mt


def make_examples(n, seed):
    rng = np.random.default_rng(seed)
    xs = rng.uniform(-3, 3, size=(n, 1)).astype(np.float32)
    return [{"x": x, "y": np.sin(x).astype(np.float32)} for x in xs]


def collate(rows):
    return {"x": np.stack([r["x"] for r in rows]), "y": np.stack([r["y"] for r in rows])}


def init_params(seed):
    rng = np.random.default_rng(seed)
    return {"l1": {"w": (rng.normal(size=(1, 32)) * 0.5).astype(np.float32), "b": np.zeros(32, np.float32)},
            "l2": {"w": (rng.normal(size=(32, 1)) * 0.2).astype(np.float32), "b": np.zeros(1, np.float32)}}


def forward(p, x):
    return mt.tanh(x @ p["l1"]["w"] + p["l1"]["b"]) @ p["l2"]["w"] + p["l2"]["b"]


def loss_fn(params, batch, key, training):
    return mt.mean(mt.square(forward(params, batch["x"]) - batch["y"]))


def test_fit_equals_a_hand_written_sgd_loop(tmp_path):
    examples = make_examples(64, 1)
    deployer = mt.Deployer(workdir=str(tmp_path / "run"), seed=3, device="cpu", verbose=False)
    trainer = mt.Trainer(deployer, collate, loss_fn, init_params(2), mt.optim.sgd(0.05))
    out = trainer.fit(examples, per_device_batch_size=8, epochs=2, shuffle=False, progress=True)
    assert out["steps"] == 16 and len(out["losses"]) == 16

    p = mt.tree_map(mt.array, init_params(2))
    expected = []
    for epoch in range(2):
        for i in range(0, 64, 8):
            batch = {k: mt.array(v) for k, v in collate(examples[i:i + 8]).items()}
            value, g = mt.value_and_grad(loss_fn)(p, batch, None, True)
            expected.append(value.item())
            p = mt.tree_map(lambda w, gw: w - 0.05 * gw, p, g)
    print(f"  [trainer] losses {out['losses'][0]:.5f} -> {out['losses'][-1]:.5f}; "
          f"max diff vs hand loop {max(abs(a - b) for a, b in zip(out['losses'], expected)):.3g}")
    assert out["losses"] == expected
    trained = trainer.params
    for path in (("l1", "w"), ("l2", "b")):
        np.testing.assert_array_equal(np.asarray(trained[path[0]][path[1]]), np.asarray(p[path[0]][path[1]]))
    assert out["losses"][-1] < out["losses"][0]

    # What the C++ Trainer writes: metrics.jsonl with each step's loss, and the last checkpoint.
    lines = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl")]
    logged = [l["loss"] for l in lines if l.get("split") == "train" and "loss" in l]
    np.testing.assert_allclose(logged, out["losses"], rtol=1e-6)
    assert os.path.isdir(tmp_path / "run" / "checkpoints")


def test_resume_continues_where_it_stopped(tmp_path):
    examples = make_examples(32, 4)
    whole = mt.Trainer(mt.Deployer(workdir=str(tmp_path / "a"), seed=5, device="cpu", verbose=False), collate,
                       loss_fn, init_params(6), mt.optim.adamw(1e-2))
    full = whole.fit(examples, per_device_batch_size=8, epochs=4, progress=False)["losses"]

    first = mt.Trainer(mt.Deployer(workdir=str(tmp_path / "b"), seed=5, device="cpu", verbose=False), collate,
                       loss_fn, init_params(6), mt.optim.adamw(1e-2))
    first.fit(examples, per_device_batch_size=8, epochs=4, max_steps=6, save_every=6, progress=False)
    second = mt.Trainer(mt.Deployer(workdir=str(tmp_path / "b"), seed=5, device="cpu", verbose=False), collate,
                        loss_fn, init_params(6), mt.optim.adamw(1e-2))
    rest = second.fit(examples, per_device_batch_size=8, epochs=4, resume=True, progress=False)["losses"]
    assert rest == full[6:]


def test_exceptions_in_user_functions_surface_as_themselves(tmp_path):
    examples = make_examples(16, 7)

    def bad_collate(rows):
        raise KeyError("no such field: 'label'")

    trainer = mt.Trainer(mt.Deployer(workdir=str(tmp_path / "c"), device="cpu", verbose=False), bad_collate, loss_fn,
                         init_params(8), mt.optim.sgd(0.1))
    with pytest.raises(KeyError, match="no such field"):
        trainer.fit(examples, per_device_batch_size=4, progress=False)

    def bad_loss(params, batch, key, training):
        raise RuntimeError("loss exploded")

    trainer = mt.Trainer(mt.Deployer(workdir=str(tmp_path / "d"), device="cpu", verbose=False), collate, bad_loss,
                         init_params(8), mt.optim.sgd(0.1))
    with pytest.raises(RuntimeError, match="loss exploded"):
        trainer.fit(examples, per_device_batch_size=4, progress=False)


def test_predictor_returns_outputs_in_order_and_eval_loss_counts_every_row(tmp_path):
    examples = make_examples(13, 9)  # not a multiple of the batch: the last batch is padded
    deployer = mt.Deployer(workdir=str(tmp_path / "p"), device="cpu", verbose=False)
    params = init_params(10)

    def pred_fn(p, batch):
        return {"y": forward(p, batch["x"])}

    predictor = mt.Predictor(deployer, collate, pred_fn, lambda out: list(out["y"][:, 0]))
    got = predictor.predict(examples, params, per_device_batch_size=4)
    p = mt.tree_map(mt.array, params)
    want = [float(np.asarray(forward(p, mt.array(e["x"][None])))[0, 0]) for e in examples]
    assert len(got) == 13
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="the examples come first"):  # C++'s order, params first
        predictor.predict(params, examples)

    trainer = mt.Trainer(deployer, collate, loss_fn, params, mt.optim.sgd(0.0))
    per_row = [loss_fn(p, {k: mt.array(v) for k, v in collate([e]).items()}, None, False).item() for e in examples]
    assert abs(trainer.eval_loss(examples, per_device_batch_size=4) - np.mean(per_row)) <= 1e-6


def test_a_workdir_with_an_earlier_runs_checkpoints_is_refused_unless_resumed_or_overwritten(tmp_path):
    """As the CLI refuses such an --output-dir: a second script run into the same workdir
    no longer replaces the first run's metrics and checkpoints unasked."""
    examples = make_examples(16, 3)
    workdir = str(tmp_path / "run")

    def trainer():
        deployer = mt.Deployer(workdir=workdir, device="cpu", verbose=False)
        return mt.Trainer(deployer, collate, loss_fn, init_params(4), mt.optim.sgd(0.1))

    first = trainer()
    first.fit(examples, per_device_batch_size=4, max_steps=2, progress=False)
    first.fit(examples, per_device_batch_size=4, max_steps=3, progress=False)  # the same Trainer goes on
    with pytest.raises(mt.Error, match="holds checkpoints of an earlier run: fit\\(..., resume=True\\)"):
        trainer().fit(examples, per_device_batch_size=4, max_steps=2, progress=False)
    assert trainer().fit(examples, per_device_batch_size=4, max_steps=4, resume=True, progress=False)["steps"] == 4
    assert trainer().fit(examples, per_device_batch_size=4, max_steps=2, overwrite=True, progress=False)["steps"] == 2


def test_optax_style_loop_equals_the_trainer(tmp_path):
    """opt.init / opt.update / optim.apply_updates over a pytree: the Trainer's step by hand."""
    examples = make_examples(32, 11)
    opt = mt.optim.chain([mt.optim.clip_by_global_norm(1.0), mt.optim.adamw(3e-3, weight_decay=0.1)])
    trainer = mt.Trainer(mt.Deployer(workdir=str(tmp_path / "o"), device="cpu", verbose=False), collate, loss_fn,
                         init_params(12), opt)
    out = trainer.fit(examples, per_device_batch_size=8, epochs=1, shuffle=False, progress=False)

    p = mt.tree_map(mt.array, init_params(12))
    state = opt.init(p)
    losses = []
    for i in range(0, 32, 8):
        batch = {k: mt.array(v) for k, v in collate(examples[i:i + 8]).items()}
        value, g = mt.value_and_grad(loss_fn)(p, batch, None, True)
        updates, state = opt.update(g, state, p)
        p = mt.optim.apply_updates(p, updates)
        losses.append(value.item())
    assert out["losses"] == losses
    np.testing.assert_array_equal(np.asarray(trainer.params["l2"]["w"]), np.asarray(p["l2"]["w"]))


def test_ctrl_c_stops_after_the_step_with_a_checkpoint_and_resume_continues(tmp_path):
    """SIGINT mid-fit: the step in flight finishes, its checkpoint is written, fit raises
    KeyboardInterrupt naming it; --resume then gives the uninterrupted run's losses."""
    import signal
    import subprocess
    import sys
    import time
    here = os.path.dirname(__file__)
    script = os.path.join(here, "interrupted_fit.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))

    whole = subprocess.run([sys.executable, script, str(tmp_path / "whole"), "1", str(tmp_path / "whole.json")],
                           env=env, capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-2000:]
    full = json.load(open(tmp_path / "whole.json"))["losses"]
    assert len(full) == 32

    proc = subprocess.Popen([sys.executable, script, str(tmp_path / "cut"), "0", str(tmp_path / "cut.json")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    time.sleep(1.0)  # ~10 steps of 0.1 s
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout[-2000:] + stderr[-2000:]
    cut = json.load(open(tmp_path / "cut.json"))
    step = cut["step"]
    assert 0 < step < 32 and f"interrupted at step {step}" in cut["interrupted"], cut
    assert os.path.isdir(tmp_path / "cut" / "checkpoints" / f"step_{step:08d}"), os.listdir(tmp_path / "cut" / "checkpoints")
    print(f"  [ctrl-c] stopped at step {step}: {cut['interrupted']}")

    resumed = subprocess.run([sys.executable, script, str(tmp_path / "cut"), "1", str(tmp_path / "rest.json")], env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rest = json.load(open(tmp_path / "rest.json"))["losses"]
    assert rest == full[step:]


def test_eval_examples_are_evaluated_and_the_plan_prints(tmp_path, capfd):
    examples, held_out = make_examples(32, 13), make_examples(10, 14)
    deployer = mt.Deployer(workdir=str(tmp_path / "e"), device="cpu", verbose=False)
    params = init_params(15)
    deployer.print_plan(params, {"l1/w": ("mlp_in", 0, 1), "l2/w": ("mlp_out", 0, 1)})
    assert "l1/w" in capfd.readouterr().out
    trainer = mt.Trainer(deployer, collate, loss_fn, params, mt.optim.sgd(0.05),
                         sharding_rules=deployer.sharding_rules(params))
    out = trainer.fit(examples, per_device_batch_size=8, epochs=2, eval_examples=held_out, eval_every=4,
                      progress=False)
    evals = [e["eval_loss"] for e in out["evals"]]
    assert len(evals) == 2  # steps 4 and 8
    assert abs(evals[-1] - trainer.eval_loss(held_out, per_device_batch_size=8)) <= 1e-6


def test_mixed_precision_trains_like_f32_and_f16_scales_its_loss(tmp_path):
    """precision="bf16" / "f16" as the CLI's --precision: the loss function sees bf16 / f16
    parameters (the f32 masters stay f32), the losses follow f32's within each dtype's rounding
    and are not f32's; f16 logs its loss scale every step; a loss scale outside f16 and an
    unknown precision are errors naming the argument."""
    examples = make_examples(64, 21)
    seen = {}

    def mixed_loss(params, batch, key, training):
        w = params["l1"]["w"]
        seen[w.dtype] = True
        x, y = mt.cast(batch["x"], w.dtype), mt.cast(batch["y"], w.dtype)
        return mt.cast(mt.mean(mt.square(forward(params, x) - y)), "f32")

    def run(precision, name=None, **kw):
        name = name or precision
        deployer = mt.Deployer(workdir=str(tmp_path / name), seed=3, device="cpu", verbose=False)
        trainer = mt.Trainer(deployer, collate, mixed_loss, init_params(22), mt.optim.adamw(3e-3),
                             precision=precision, **kw)
        out = trainer.fit(examples, per_device_batch_size=8, epochs=2, shuffle=False, progress=True)
        assert np.asarray(trainer.params["l1"]["w"]).dtype == np.float32, "the master weights stay f32"
        lines = [json.loads(l) for l in open(tmp_path / name / "metrics.jsonl")]
        return out["losses"], [l.get("loss_scale") for l in lines if l.get("split") == "train"], trainer

    f32, f32_scales, _ = run("f32")
    bf16, _, _ = run("bf16")
    # A fixed scale of 256 does not overflow here: step for step against f32.
    f16, f16_scales, trainer = run("f16", loss_scale=256)
    assert seen.keys() >= {"f32", "bf16", "f16"}
    rel = lambda a: max(abs(x - y) / abs(y) for x, y in zip(a, f32))
    print(f"  [max err] losses over 16 steps, relative to f32: bf16 {rel(bf16):.3g}, f16 {rel(f16):.3g}")
    assert len(bf16) == len(f16) == len(f32) == 16
    assert 1e-6 < rel(bf16) < 5e-2 and 1e-7 < rel(f16) < 5e-3
    assert f32_scales == [None] * 16 and f16_scales == [256] * 16
    assert abs(trainer.eval_loss(examples, per_device_batch_size=8) - f16[-1]) < 0.5
    # The dynamic scale: 65536 overflows this regression's f16 weight gradients (8 rows of
    # |x| up to 3 times a scaled error), so the first steps are skipped and the scale halves;
    # then it doubles after every 4 finite steps.
    dynamic, scales, _ = run("f16", "f16_dynamic", loss_scale_window=4)
    print(f"  f16 dynamic loss scale per step: {scales}")
    assert scales[0] == 65536 and scales[1] == 32768, "65536 overflows and is halved"
    skipped = sum(1 for a, b in zip(scales, scales[1:]) if b < a)
    assert skipped < 12 and max(scales[skipped:]) > min(scales), "then it grows again"
    assert all(np.isfinite(dynamic))

    with pytest.raises(Exception, match="loss_scale applies to precision='f16'"):
        mt.Trainer(mt.Deployer(workdir=str(tmp_path / "x"), device="cpu", verbose=False), collate, mixed_loss,
                   init_params(22), mt.optim.adamw(3e-3), precision="bf16", loss_scale=1024)
    # NumPy numbers are scales; a bool is not.
    mt.Trainer(mt.Deployer(workdir=str(tmp_path / "n"), device="cpu", verbose=False), collate, mixed_loss,
               init_params(22), mt.optim.adamw(3e-3), precision="f16", loss_scale=np.float32(256))
    with pytest.raises(Exception, match="loss_scale must be 'dynamic' or a number, got True"):
        mt.Trainer(mt.Deployer(workdir=str(tmp_path / "b"), device="cpu", verbose=False), collate, mixed_loss,
                   init_params(22), mt.optim.adamw(3e-3), precision="f16", loss_scale=True)
    with pytest.raises(Exception, match="precision.*expected f32, tf32, bf16, f16 or bf16-matmul"):
        mt.Trainer(mt.Deployer(workdir=str(tmp_path / "y"), device="cpu", verbose=False), collate, mixed_loss,
                   init_params(22), mt.optim.adamw(3e-3), precision="fp8")
