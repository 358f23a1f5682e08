"""Sequence to sequence in Python, the Redco paper's complete example (its appendix) on a task
small enough to learn from scratch in seconds: a small BART reads 3 to 5 distinct words and
writes them in alphabetical order — examples/seq2seq.cpp with collate (tokenize source and
target), loss (teacher-forced cross-entropy) and predict (beam search) written in Python.
Held-out pairs are scored by ROUGE-L and exact match.

    PYTHONPATH=build/python python3 examples/python/seq2seq.py [steps=300] [workdir=runs/seq2seq_py]

Exits non-zero when the loss did not fall or exact match is below 0.8."""
import os
import random
import sys

import numpy as np

import meshtrain as mt

MAX_LEN = 6  # 5 words and the end token; every batch is padded to it
WORDS = ["apple", "bird", "cat", "dog", "egg", "fish", "goat", "hat", "ink", "jam", "kite", "lamp"]


def sorting_pairs(n):  # {"source": "kite dog apple", "target": "apple dog kite"}, no source twice
    rng, seen, pairs = random.Random(7), set(), []
    while len(pairs) < n:
        words = rng.sample(WORDS, 3 + rng.randrange(3))
        source = " ".join(words)
        if source not in seen:
            seen.add(source)
            pairs.append({"source": source, "target": " ".join(sorted(words))})
    return pairs


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    workdir = sys.argv[2] if len(sys.argv) > 2 else "runs/seq2seq_py"
    os.makedirs(workdir, exist_ok=True)
    # A WordPiece vocabulary of BERT's special tokens and the twelve words.
    with open(os.path.join(workdir, "vocab.txt"), "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    tokenizer = mt.Tokenizer.from_file(os.path.join(workdir, "vocab.txt"))
    pad, eos = tokenizer.token_to_id("[PAD]"), tokenizer.token_to_id("[SEP]")
    pairs = sorting_pairs(2000 + 64)
    train, test = pairs[:-64], pairs[-64:]

    deployer = mt.Deployer(workdir=workdir, verbose=False)
    config = mt.models.small_seq2seq_config("bart", tokenizer.vocab_size, pad, eos)
    model, params = mt.models.init_model(config, mt.random.key(0))
    start = config.get("decoder_start_token_id", eos)

    def collate(rows):  # source and target, each closed by the end token and padded to MAX_LEN
        n = len(rows)
        ids, mask, labels = np.full((n, MAX_LEN), pad), np.zeros((n, MAX_LEN), np.int64), np.full((n, MAX_LEN), -100)
        for i, r in enumerate(rows):
            source = tokenizer.encode(r["source"], add_special_tokens=False)[:MAX_LEN - 1] + [eos]
            target = tokenizer.encode(r["target"], add_special_tokens=False)[:MAX_LEN - 1] + [eos]
            ids[i, :len(source)], mask[i, :len(source)], labels[i, :len(target)] = source, 1, target
        # Teacher forcing: the decoder reads the labels shifted right behind its start token.
        decoder = np.concatenate([np.full((n, 1), start), np.where(labels[:, :-1] == -100, pad, labels[:, :-1])], 1)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, "decoder_input_ids": decoder}

    def loss_fn(p, b, key, training):
        return model.loss(p, b["input_ids"], b["labels"], attention_mask=b["attention_mask"],
                          decoder_input_ids=b["decoder_input_ids"], key=key, training=training)

    def pred_fn(p, b):  # beam search (4 beams) from each source of the batch
        ids, mask = np.asarray(b["input_ids"]), np.asarray(b["attention_mask"])
        sources = [[int(t) for t, m in zip(row, mrow) if m] for row, mrow in zip(ids, mask)]
        out = np.full((len(sources), MAX_LEN), pad, np.int64)
        for i, toks in enumerate(model.generate(p, sources, max_new_tokens=MAX_LEN, num_beams=4)):
            out[i, :len(toks)] = toks[:MAX_LEN]
        return {"tokens": out}

    lr = mt.optim.warmup_cosine_decay_schedule(0.0, 2e-3, steps // 10, steps)
    optimizer = mt.optim.chain([mt.optim.clip_by_global_norm(1.0), mt.optim.adamw(lr)])
    trainer = mt.Trainer(deployer, collate, loss_fn, params, optimizer,
                         sharding_rules=mt.sharding_rules(deployer, params, model.param_roles()))
    predictor = mt.Predictor(deployer, collate, pred_fn, lambda out: [tokenizer.decode(list(r)) for r in out["tokens"]])
    losses = trainer.fit(train, per_device_batch_size=32 // deployer.data_size, epochs=1000, max_steps=steps,
                         progress=False, overwrite=True)["losses"]  # a demo: a rerun starts over
    predictions = predictor.predict(test, trainer.params, per_device_batch_size=32)
    targets = [r["target"] for r in test]
    exact = float(np.mean([p == t for p, t in zip(predictions, targets)]))
    rouge_l = mt.metrics.rouge(targets, predictions)["rougeL"]["fmeasure"]

    k = max(1, len(losses) // 10)
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    deployer.log(f"train loss {first:.4f} -> {last:.4f} (mean of the first and last {k} steps)")
    deployer.log(f"held out: ROUGE-L {rouge_l:.4f}, exact match {exact:.4f} on {len(targets)} pairs (beam search, 4 beams)")
    for r, p in list(zip(test, predictions))[:4]:
        deployer.log(f"  {r['source']}  ->  {p}")
    ok = last < first and exact >= 0.8
    if not ok:
        deployer.log("error: the loss did not fall or exact match is below 0.8")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
