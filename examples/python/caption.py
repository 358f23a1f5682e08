"""Image captioning in Python, the Redco paper's Figure 4: collate returns the images'
pixel_values and the captions' token ids, loss is the cross-entropy of a vision-encoder /
text-decoder model (a small ViT and a GPT-2 that cross-attends to it), predict is beam search
over the image — examples/caption.cpp with the three functions written in Python. The images
are drawn here with NumPy: two coloured shapes side by side or one above the other, 32x32,
captioned "a red circle left of a blue square"; the model is trained from scratch and
captions 100 held-out images.

    PYTHONPATH=build/python python3 examples/python/caption.py [steps=1200] [workdir=runs/caption_py]

Exits non-zero when the loss did not fall or exact match is below 0.8."""
import os
import random
import sys

import numpy as np

import meshtrain as mt

SIZE, MAX_LEN = 32, 10  # pixels per side; caption tokens with the end token
COLORS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (230, 200, 30)}
SHAPES = ["circle", "square", "triangle"]


def draw(image, shape, rgb, x0, y0, s):
    """A filled disc, square or upward triangle in the box [x0, x0 + s) x [y0, y0 + s)."""
    v, u = (np.mgrid[0:s, 0:s] + 0.5) / s
    inside = {"square": np.ones((s, s), bool), "circle": (u - 0.5) ** 2 + (v - 0.5) ** 2 <= 0.25,
              "triangle": np.abs(u - 0.5) <= v / 2}[shape]
    image[y0:y0 + s, x0:x0 + s][inside] = rgb


def render(rng):
    c1, c2 = rng.sample(list(COLORS), 2)
    s1, s2 = rng.choice(SHAPES), rng.choice(SHAPES)
    beside = rng.random() < 0.5
    image = np.full((SIZE, SIZE, 3), 245, np.uint8)
    s = rng.randint(9, 12)
    a = rng.randint(2, SIZE - s - 2)
    b = min(max(a + rng.randint(-3, 3), 1), SIZE - s - 1)
    near, far = rng.randint(1, 3), rng.randint(17, SIZE - s - 1)
    if beside:
        draw(image, s1, COLORS[c1], near, a, s)
        draw(image, s2, COLORS[c2], far, b, s)
    else:
        draw(image, s1, COLORS[c1], a, near, s)
        draw(image, s2, COLORS[c2], b, far, s)
    return image, f"a {c1} {s1} {'left of' if beside else 'above'} a {c2} {s2}"


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1200
    workdir = sys.argv[2] if len(sys.argv) > 2 else "runs/caption_py"
    os.makedirs(workdir, exist_ok=True)
    rng = random.Random(11)
    pictures = [render(rng) for _ in range(2000 + 100)]
    train, test = [{"index": i} for i in range(2000)], [{"index": i} for i in range(2000, 2100)]
    with open(os.path.join(workdir, "vocab.txt"), "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "left", "of", "above"] + list(COLORS)
                          + SHAPES) + "\n")
    tokenizer = mt.Tokenizer.from_file(os.path.join(workdir, "vocab.txt"))
    pad, eos = tokenizer.token_to_id("[PAD]"), tokenizer.token_to_id("[SEP]")

    deployer = mt.Deployer(workdir=workdir, verbose=False)
    # A small ViT-GPT2 (4 + 4 layers, width 128, 8x8 patches); [SEP] ends a caption and starts the decoder.
    config = mt.models.small_config("vision-encoder-decoder", tokenizer.vocab_size, 64, eos)
    config["pad_token_id"] = pad
    model, params = mt.models.init_model(config, mt.random.key(0))
    processor = mt.data.ImageProcessor(size=config["encoder"]["image_size"])  # ViTImageProcessor's defaults
    start = config["decoder_start_token_id"]

    def collate(rows):  # pixel_values, the captions closed by the end token, and the decoder's inputs
        labels = np.full((len(rows), MAX_LEN), -100)
        for i, r in enumerate(rows):
            ids = tokenizer.encode(pictures[r["index"]][1], add_special_tokens=False)[:MAX_LEN - 1] + [eos]
            labels[i, :len(ids)] = ids
        # Teacher forcing: the decoder reads the labels shifted right behind its start token.
        decoder = np.concatenate([np.full((len(rows), 1), start), np.where(labels[:, :-1] == -100, pad, labels[:, :-1])], 1)
        return {"pixel_values": processor([pictures[r["index"]][0] for r in rows]), "labels": labels,
                "decoder_input_ids": decoder}

    def loss_fn(p, b, key, training):
        return model.loss(p, labels=b["labels"], pixel_values=b["pixel_values"],
                          decoder_input_ids=b["decoder_input_ids"], key=key, training=training)

    def pred_fn(p, b):  # beam search (3 beams) over each image
        out = np.full((b["pixel_values"].shape[0], MAX_LEN), pad, np.int64)
        for i, toks in enumerate(model.generate(p, pixel_values=b["pixel_values"], max_new_tokens=MAX_LEN, num_beams=3)):
            out[i, :len(toks)] = toks[:MAX_LEN]
        return {"tokens": out}

    def caption(tokens):
        ids = []
        for t in tokens:
            if t == eos or t < 0:
                break
            ids.append(int(t))
        return tokenizer.decode(ids)

    lr = mt.optim.warmup_cosine_decay_schedule(0.0, 1e-3, steps // 20, steps, 1e-4)
    optimizer = mt.optim.chain([mt.optim.clip_by_global_norm(1.0), mt.optim.adamw(lr)])
    trainer = mt.Trainer(deployer, collate, loss_fn, params, optimizer,
                         sharding_rules=mt.sharding_rules(deployer, params, model.param_roles()))
    predictor = mt.Predictor(deployer, collate, pred_fn, lambda out: [caption(r) for r in out["tokens"]])
    losses = trainer.fit(train, per_device_batch_size=32 // deployer.data_size, epochs=1000, max_steps=steps,
                         progress=False, overwrite=True)["losses"]  # a demo: a rerun starts over
    predictions = predictor.predict(test, trainer.params, per_device_batch_size=50)
    truths = [pictures[r["index"]][1] for r in test]
    exact = float(np.mean([p == t for p, t in zip(predictions, truths)]))
    bleu = mt.metrics.bleu(predictions, [[t] for t in truths])["score"]

    k = max(1, len(losses) // 10)
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    deployer.log(f"train loss {first:.4f} -> {last:.4f} (mean of the first and last {k} steps)")
    deployer.log(f"held out: exact match {exact:.4f}, BLEU-4 {bleu:.2f} on {len(truths)} images (beam search, 3 beams)")
    for t, p in list(zip(truths, predictions))[:4]:
        deployer.log(f"  {t}  ->  {p}")
    ok = last < first and exact >= 0.8
    if not ok:
        deployer.log("error: the loss did not fall or exact match is below 0.8")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
