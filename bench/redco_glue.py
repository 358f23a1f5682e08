"""The seed system's GLUE classification pipeline: Redco 0.4.23 (Deployer, Trainer, Predictor)
over transformers' FlaxBertForSequenceClassification, JAX on the CPU, run by
bench/glue_side_by_side.py --peers redco in .venv-bench (make bench-peers). The user code
follows Redco's classification example: a collate function (tokenize, pad to max length), a
loss function (softmax cross-entropy on the logits), a prediction function (argmax) and a
metric; the optimizer is optax.adamw with Redco's linear schedule. GLUE is read from the TSV
files (the hub is out of reach). Prints one JSON line: accuracy, f1, steps, the median step
time after the first (compiling) step, peak RSS, and the user code's line count.

  .venv-bench/bin/python3 bench/redco_glue.py --model DIR --task sst2 --data-dir DIR ...
"""
# --- user code begins (counted as Redco's lines of user code) ---
import argparse
import csv
import json
import os
import resource
import tempfile
import time
from functools import partial

import jax
import numpy as np
import optax
from redco import Deployer, Predictor, Trainer
from transformers import AutoTokenizer, FlaxBertForSequenceClassification

TASKS = {"sst2": ("SST-2", ["sentence"], "label"), "mrpc": ("MRPC", ["#1 String", "#2 String"], "Quality")}


def read_tsv(path, columns, label):
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [{"texts": [r[c] for c in columns], "label": int(r[label])} for r in rows]


def collate_fn(examples, tokenizer, max_length):
    texts = [tuple(e["texts"]) if len(e["texts"]) == 2 else e["texts"][0] for e in examples]
    batch = tokenizer(texts, max_length=max_length, padding="max_length", truncation=True, return_tensors="np")
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    batch["labels"] = np.array([e["label"] for e in examples])
    return batch


def loss_fn(rng, state, params, batch, is_training):
    labels = batch.pop("labels")
    logits = state.apply_fn(**batch, params=params, dropout_rng=rng, train=is_training).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=labels).mean()


def pred_fn(rng, params, batch, model):
    batch.pop("labels")
    return model(**batch, params=params, train=False).logits.argmax(axis=-1)


def eval_metric_fn(examples, preds):
    labels = np.array([e["label"] for e in examples])
    preds = np.array(preds)
    tp, fp, fn = [int(np.sum((preds == a) & (labels == b))) for a, b in ((1, 1), (1, 0), (0, 1))]
    return {"acc": float(np.mean(preds == labels)), "f1": 2 * tp / max(1, 2 * tp + fp + fn)}


def main(a):
    folder, columns, label = TASKS[a.task]
    train = read_tsv(os.path.join(a.data_dir, folder, "train.tsv"), columns, label)[:a.max_train_samples]
    dev = read_tsv(os.path.join(a.data_dir, folder, "dev.tsv"), columns, label)
    deployer = Deployer(jax_seed=a.seed, n_model_shards=1, workdir=a.workdir, verbose=False)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = FlaxBertForSequenceClassification.from_pretrained(a.model, num_labels=2, from_pt=True)
    lr_schedule_fn = deployer.get_lr_schedule_fn(
        train_size=len(train), per_device_batch_size=a.batch_size, n_epochs=a.epochs,
        learning_rate=a.learning_rate, schedule_type="linear", warmup_steps=a.warmup_steps)
    optimizer = optax.adamw(learning_rate=lr_schedule_fn, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0)
    trainer = Trainer(
        deployer=deployer,
        collate_fn=partial(collate_fn, tokenizer=tokenizer, max_length=a.max_seq_length),
        apply_fn=model, loss_fn=loss_fn, params=model.params, optimizer=optimizer, lr_schedule_fn=lr_schedule_fn,
        params_sharding_rules=deployer.get_sharding_rules(params_shape_or_params=model.params))
    predictor = Predictor(deployer=deployer, collate_fn=partial(collate_fn, tokenizer=tokenizer,
                                                                max_length=a.max_seq_length),
                          pred_fn=partial(pred_fn, model=model))
    # --- user code ends ---
    # Each training step timed to its result (the first includes XLA's compilation).
    times, run_model_step = [], deployer.run_model_step

    def timed_step(step_fn, input_args):
        t = time.perf_counter()
        out = jax.block_until_ready(run_model_step(step_fn=step_fn, input_args=input_args))
        times.append(time.perf_counter() - t)
        return out

    deployer.run_model_step = timed_step
    t0 = time.perf_counter()
    trainer.fit(train_examples=train, per_device_batch_size=a.batch_size, n_epochs=a.epochs,
                eval_examples=None, eval_sanity_check=False)
    fit_s = time.perf_counter() - t0
    deployer.run_model_step = run_model_step  # prediction steps are not training steps
    preds = predictor.predict(examples=dev, params=trainer.state.params, params_replicated=trainer.mesh is None,
                              params_sharded=trainer.mesh is not None, per_device_batch_size=64)
    metrics = eval_metric_fn(dev, preds)
    return {"side": "redco", "jax": jax.__version__, "accuracy": metrics["acc"], "f1": metrics["f1"],
            "steps": len(times), "train_seconds": fit_s, "first_step_s": times[0],
            "median_step_s": sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def user_code_lines():
    """Non-blank, non-comment lines between the user-code markers of this file."""
    lines = open(__file__).read().split("\n")
    begin = next(i for i, l in enumerate(lines) if "user code begins" in l)
    end = next(i for i, l in enumerate(lines) if "user code ends" in l)
    return sum(1 for l in lines[begin + 1:end] if l.strip() and not l.strip().startswith("#"))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--task", choices=sorted(TASKS), required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--max-train-samples", type=int)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--workdir", default=tempfile.mkdtemp(prefix="redco_glue_"))
    r = main(p.parse_args())
    r["user_code_lines"] = user_code_lines()
    print(json.dumps(r))
