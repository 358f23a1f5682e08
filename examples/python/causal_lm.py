"""The miniGPT tutorial in Python: pretrain a small decoder on Tiny Shakespeare (one token per
byte), sample from it, then fine-tune it with LoRA on one character's lines and save the
adapter in PEFT's layout — examples/causal_lm.cpp's pipeline, plus the LoRA step, with the
user's functions in Python.

    PYTHONPATH=build/python python3 examples/python/causal_lm.py [data_dir=../shared/data]
        [steps=300] [lora_steps=100] [workdir=runs/causal_lm_py]

Exits non-zero when pretraining did not lower the loss, or LoRA did not lower the held-out
loss on the character's lines, or changed anything but the adapters."""
import math
import os
import sys

import numpy as np

import meshtrain as mt

SEQ_LEN = 128


def sequences(text, n_max=None):  # non-overlapping windows of SEQ_LEN bytes
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    n = len(data) // SEQ_LEN
    if n_max:
        n = min(n, n_max)
    return [{"ids": data[i * SEQ_LEN:(i + 1) * SEQ_LEN]} for i in range(n)]


def character_lines(text, name):  # the speeches of one character, joined
    out, take = [], False
    for line in text.splitlines():
        if line.isupper() and line.endswith(":"):
            take = line == name + ":"
        elif take and line.strip():
            out.append(line)
    return "\n".join(out)


def collate(rows):
    return {"ids": np.stack([r["ids"] for r in rows])}


def main():
    data_dir = sys.argv[1] if len(sys.argv) > 1 else "../shared/data"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    lora_steps = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    workdir = sys.argv[4] if len(sys.argv) > 4 else "runs/causal_lm_py"
    text = open(os.path.join(data_dir, "text", "tinyshakespeare.txt"), encoding="utf-8").read()

    deployer = mt.Deployer(workdir=os.path.join(workdir, "pretrain"), verbose=False)
    config = {"model_type": "minigpt", "vocab_size": 256, "maxlen": SEQ_LEN, "embed_dim": 128, "num_heads": 4,
              "feed_forward_dim": 256, "num_transformer_blocks": 2, "dropout_rate": 0.0}
    model, params = mt.models.init_model(config, mt.random.key(0))

    def loss_fn(p, batch, key, training):  # next-byte cross-entropy (labels shifted inside)
        return model.loss(p, batch["ids"], batch["ids"], key=key, training=training)

    lr = mt.optim.warmup_cosine_decay_schedule(0.0, 3e-3, steps // 10, steps)
    trainer = mt.Trainer(deployer, collate, loss_fn, params, mt.optim.adamw(lr),
                         sharding_rules=mt.sharding_rules(deployer, params, model.param_roles()))
    losses = trainer.fit(sequences(text), per_device_batch_size=16 // deployer.data_size, epochs=1000,
                         max_steps=steps, progress=False, overwrite=True)["losses"]  # a rerun starts over
    params = trainer.params
    k = max(1, len(losses) // 5)
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    deployer.log(f"pretrain loss {first:.4f} -> {last:.4f} nats/byte (uniform: {math.log(256):.4f})")
    prompt = "ROMEO:\n"
    sample = model.generate(params, [list(prompt.encode())], max_new_tokens=120, temperature=0.8, top_k=40, seed=1)[0]
    deployer.log("sample:\n" + prompt + bytes(t for t in sample if t < 256).decode("utf-8", "replace"))

    # LoRA on one character's speeches: adapters trained, the pretrained weights frozen.
    lines = character_lines(text, "MENENIUS")
    ft = sequences(lines)
    held_out, ft_train = ft[:8], ft[8:]
    lora_model, lora_params = model.add_lora(params, rank=4, alpha=8.0, key=mt.random.key(2))

    def lora_loss(p, batch, key, training):
        return lora_model.loss(p, batch["ids"], batch["ids"], key=key, training=training)

    ft_deployer = mt.Deployer(workdir=os.path.join(workdir, "lora"), verbose=False)
    ft_trainer = mt.Trainer(ft_deployer, collate, lora_loss, lora_params, mt.optim.lora(mt.optim.adamw(3e-3)))
    before = ft_trainer.eval_loss(held_out, per_device_batch_size=8)
    ft_trainer.fit(ft_train, per_device_batch_size=8 // ft_deployer.data_size, epochs=1000, max_steps=lora_steps,
                   progress=False, overwrite=True)
    after = ft_trainer.eval_loss(held_out, per_device_batch_size=8)
    tuned = ft_trainer.params
    changed = [p for p in lora_params if not np.array_equal(np.asarray(tuned[p]), np.asarray(lora_params[p]))]
    only_adapters = bool(changed) and all("lora_" in p for p in changed)
    deployer.log(f"LoRA (rank 4, {sum('lora_' in p for p in lora_params)} adapter arrays) on MENENIUS' lines: "
                 f"held-out loss {before:.4f} -> {after:.4f}; changed only adapters: {only_adapters}")
    lora_model.save_adapter(tuned, os.path.join(workdir, "adapter"))
    ok = last < first and after < before and only_adapters
    if not ok:
        deployer.log("error: pretraining or LoRA did not do what it should")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
