"""The seed tutorial's miniGPT side by side on the CPU: Flax NNX + Optax (JAX) against
`meshtrain pretrain --model minigpt` with the same config, data, batch, steps and optimizer.
Run in .venv-bench (make bench-peers):

  .venv-bench/bin/python3 bench/seed_minigpt.py [--steps 60] [--batch 8] [--seq-len 256]

Both sides train the tutorial's model (vocab 50257, embed 256, 8 heads, feed-forward 256, 8
post-LayerNorm blocks, dropout 0.1, untied output layer without bias) on Tiny Shakespeare
tokenized with the GPT-2 tokenizer, packed into sequences of seq_len + 1 tokens, with AdamW
(betas 0.9/0.999, eps 1e-8, weight decay 0.01 on matrices), gradients clipped to norm 1,
linear warmup then cosine to 10 % of the peak. The Flax model is written here from the
tutorial's description; the two sides initialize and shuffle with their own generators, so
the curves agree in shape, not bit for bit. Prints tok/s (median step after the first, which
compiles on the JAX side) and the loss at a few steps for each side.
"""
import argparse
import json
import os
import resource
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "..", "shared", "data")
CONFIG = {"model_type": "minigpt", "vocab_size": 50257, "maxlen": 256, "embed_dim": 256, "num_heads": 8,
          "feed_forward_dim": 256, "num_transformer_blocks": 8, "dropout_rate": 0.1}


class Block(nnx.Module):
    def __init__(self, c, rngs):
        e = c["embed_dim"]
        self.attn = nnx.MultiHeadAttention(num_heads=c["num_heads"], in_features=e, qkv_features=e, out_features=e,
                                           decode=False, dropout_rate=0.0, rngs=rngs)
        self.ln1 = nnx.LayerNorm(e, epsilon=1e-6, rngs=rngs)
        self.linear1 = nnx.Linear(e, c["feed_forward_dim"], rngs=rngs)
        self.linear2 = nnx.Linear(c["feed_forward_dim"], e, rngs=rngs)
        self.ln2 = nnx.LayerNorm(e, epsilon=1e-6, rngs=rngs)
        self.drop1 = nnx.Dropout(c["dropout_rate"], rngs=rngs)
        self.drop2 = nnx.Dropout(c["dropout_rate"], rngs=rngs)

    def __call__(self, x, mask):
        x = self.ln1(x + self.drop1(self.attn(x, mask=mask)))
        return self.ln2(x + self.drop2(self.linear2(nnx.relu(self.linear1(x)))))


class MiniGpt(nnx.Module):
    def __init__(self, c, rngs):
        self.tok = nnx.Embed(c["vocab_size"], c["embed_dim"], rngs=rngs)
        self.pos = nnx.Embed(c["maxlen"], c["embed_dim"], rngs=rngs)
        self.blocks = [Block(c, rngs) for _ in range(c["num_transformer_blocks"])]
        self.out = nnx.Linear(c["embed_dim"], c["vocab_size"], use_bias=False, rngs=rngs)

    def __call__(self, ids):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(jnp.arange(t)[None, :])
        mask = nnx.make_causal_mask(ids)
        for b in self.blocks:
            x = b(x, mask)
        return self.out(x)


def windows(seq_len):
    tok = Tokenizer.from_file(os.path.join(DATA, "models", "hf-tiny-gpt2", "tokenizer.json"))
    with open(os.path.join(DATA, "text", "tinyshakespeare.txt"), encoding="utf-8") as f:
        ids = np.array(tok.encode(f.read()).ids, dtype=np.int32)
    n = len(ids) // (seq_len + 1)
    return ids[: n * (seq_len + 1)].reshape(n, seq_len + 1)


def schedule(a):
    return optax.warmup_cosine_decay_schedule(0.0, a.learning_rate, a.warmup_steps, a.steps, a.learning_rate * 0.1)


def run_flax(a):
    c = dict(CONFIG, maxlen=a.seq_len)
    model = MiniGpt(c, nnx.Rngs(a.seed))
    is_matrix = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # decay matrices, not biases/norms
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule(a), b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, mask=is_matrix))
    opt = nnx.Optimizer(model, tx)

    @nnx.jit
    def step(model, opt, batch):
        def loss_fn(m):
            logits = m(batch[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(grads)
        return loss

    data = windows(a.seq_len)
    order = np.random.default_rng(a.seed).permutation(len(data))
    losses, times = [], []
    for s in range(a.steps):
        rows = order[(s * a.batch) % len(order):][: a.batch]
        batch = jnp.asarray(data[rows])
        t = time.perf_counter()
        losses.append(float(step(model, opt, batch)))  # float() waits for the result
        times.append(time.perf_counter() - t)
    return {"losses": losses, "step_s": sorted(times[1:])[len(times[1:]) // 2], "first_step_s": times[0],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "jax": jax.__version__}


def run_meshtrain(a):
    out = tempfile.mkdtemp(prefix="seed_minigpt_")
    config = os.path.join(out, "config.json")
    with open(config, "w") as f:
        json.dump(dict(CONFIG, maxlen=a.seq_len), f)
    cmd = [os.path.join(ROOT, "build", "apps", "meshtrain", "meshtrain"), "pretrain", "--model", "minigpt",
           "--config", config, "--tokenizer", os.path.join(DATA, "models", "hf-tiny-gpt2", "tokenizer.json"),
           "--data", os.path.join(DATA, "text", "tinyshakespeare.txt"), "--seq-len", str(a.seq_len), "--steps",
           str(a.steps), "--per-device-batch-size", str(a.batch), "--learning-rate", str(a.learning_rate),
           "--warmup-steps", str(a.warmup_steps), "--eval-fraction", "0", "--seed", str(a.seed), "--output-dir",
           os.path.join(out, "run"), "--overwrite", "--sample-tokens", "1"]
    r = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"meshtrain pretrain failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    losses, rates = [], []
    with open(os.path.join(out, "run", "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if m.get("split") == "train" and "loss" in m:
                losses.append(m["loss"])
                rates.append(m["tokens_per_s"])
    rss = [l for l in r.stderr.splitlines() if "Maximum resident set size" in l]
    rate = sorted(rates[1:])[len(rates[1:]) // 2] if len(rates) > 1 else None
    return {"losses": losses, "step_s": a.batch * a.seq_len / rate if rate else None,
            "peak_rss_mb": int(rss[0].split()[-1]) / 1024 if rss else None, "log": r.stdout.strip().splitlines()[-3:]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    tokens = a.batch * a.seq_len
    print(f"miniGPT {CONFIG} seq {a.seq_len}, batch {a.batch}, {a.steps} steps, lr {a.learning_rate}, "
          f"{os.cpu_count()} CPUs", flush=True)
    results = {"meshtrain": run_meshtrain(a), "flax nnx": run_flax(a)}
    marks = [s for s in (1, 10, 20, 30, 40, 50, 60, 80, 100, a.steps) if s <= a.steps]
    print("| side | tok/s | peak RSS | " + " | ".join(f"loss @{s}" for s in sorted(set(marks))) + " |")
    print("|---|---|---|" + "---|" * len(set(marks)))
    for side, r in results.items():
        rate = tokens / r["step_s"] if r["step_s"] else float("nan")
        losses = " | ".join(f"{r['losses'][s - 1]:.3f}" if len(r["losses"]) >= s else "n/a" for s in sorted(set(marks)))
        print(f"| {side} | {rate:.0f} | {r['peak_rss_mb']:.0f} MB | {losses} |")
    print(f"(JAX {results['flax nnx']['jax']}: first step with compilation {results['flax nnx']['first_step_s']:.1f} s)")


if __name__ == "__main__":
    main()
