#!/usr/bin/env python3
"""The Python front end's overhead: a training step written in Python (mt.value_and_grad over
the model's loss, AdamW through opt.update / optim.apply_updates, params a dict of arrays)
against the same step in C++ (bench/model_step_bench: value_and_grad + AdamW on the same
workload, shapes and random tokens), in separate processes on the same machine. Reports
median seconds per step and the ratio (issue 46's goal: <= 1.05x). Not asserted anywhere.

    PYTHONPATH=build/python python3 bench/python_overhead.py [--build build] [--steps 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

WORKLOADS = {
    # name: (model_step_bench workload, config.json of the same model, batch, seq)
    "minigpt4 16x128": ("minigpt4", {"model_type": "minigpt", "vocab_size": 50257, "maxlen": 128, "embed_dim": 256,
                                     "num_heads": 8, "feed_forward_dim": 256, "num_transformer_blocks": 4}, 16, 128),
    "gpt2 4x256": ("gpt2", {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768,
                            "n_layer": 12, "n_head": 12}, 4, 256),
}


def python_step_seconds(config, batch, seq, warmup, steps):
    import meshtrain as mt
    model, params = mt.models.init_model(config, mt.random.key(0))
    rng = np.random.default_rng(1)
    ids = mt.array(rng.integers(0, config["vocab_size"], size=(batch, seq), dtype=np.int64))
    labels = mt.array(rng.integers(0, config["vocab_size"], size=(batch, seq), dtype=np.int64))
    opt = mt.optim.adamw(1e-4, weight_decay=0.01)
    state = opt.init(params)

    def loss_fn(p, key):  # the user's Python loss: the model's own cross-entropy
        return model.loss(p, ids, labels, key=key, training=True)

    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        value, grads = mt.value_and_grad(loss_fn)(params, mt.random.key(5, s))
        updates, state = opt.update(grads, state, params)
        grads = None
        params = mt.optim.apply_updates(params, updates)
        value.item()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", default=None, help="one workload name")
    ap.add_argument("--python-side", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.python_side:  # the child process: one workload's Python steps
        _, config, b, t = WORKLOADS[args.python_side]
        print(json.dumps({"step_s": python_step_seconds(config, b, t, args.warmup, args.steps)}))
        return
    bench = os.path.join(args.build, "bench", "model_step_bench")
    cpu = subprocess.run([bench, "peak"], capture_output=True, text=True).stdout.strip().splitlines()
    print(f"# {cpu[0] if cpu else ''}")
    print(f"{'workload':<18} {'C++ s/step':>11} {'Python s/step':>14} {'ratio':>7}")
    for name, (workload, _, b, t) in WORKLOADS.items():
        if args.only and name != args.only:
            continue
        cxx = subprocess.run([bench, workload, str(b), str(t), str(args.warmup), str(args.steps), "f32"],
                             capture_output=True, text=True, check=True)
        cxx_s = json.loads(cxx.stdout.strip().splitlines()[-1])["step_s"]
        py = subprocess.run([sys.executable, __file__, "--python-side", name, "--warmup", str(args.warmup),
                             "--steps", str(args.steps)], capture_output=True, text=True, check=True)
        py_s = json.loads(py.stdout.strip().splitlines()[-1])["step_s"]
        print(f"{name:<18} {cxx_s:>11.3f} {py_s:>14.3f} {py_s / cxx_s:>7.3f}")


if __name__ == "__main__":
    main()
