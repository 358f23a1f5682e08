"""Renders the captioning task of tests/e2e/caption_e2e_test.cpp: 32x32 PNG images of two coloured shapes side by side or one
above the other, captioned as "a red circle left of a blue square" / "... above ...".
usage: render_shapes.py OUT N_TRAIN N_EVAL SEED
Writes OUT/img/*.png, OUT/train.jsonl, OUT/eval.jsonl and OUT/vocab.txt (a WordPiece vocabulary
of the caption words)."""
import json
import os
import random
import sys

from PIL import Image, ImageDraw

COLORS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (230, 200, 30)}
SHAPES = ["circle", "square", "triangle"]


def draw(d, shape, color, box):
    x0, y0, x1, y1 = box
    if shape == "circle":
        d.ellipse(box, fill=color)
    elif shape == "square":
        d.rectangle(box, fill=color)
    else:
        d.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=color)


def render(rng):
    (c1, c2) = rng.sample(list(COLORS), 2)
    s1, s2 = rng.choice(SHAPES), rng.choice(SHAPES)
    relation = rng.choice(["left of", "above"])
    im = Image.new("RGB", (32, 32), (245, 245, 245))
    d = ImageDraw.Draw(im)
    size = rng.randint(9, 12)
    if relation == "left of":
        y = rng.randint(2, 32 - size - 2)
        y2 = min(max(y + rng.randint(-3, 3), 1), 32 - size - 1)
        draw(d, s1, COLORS[c1], (rng.randint(1, 3), y, rng.randint(1, 3) + size, y + size))
        x2 = rng.randint(17, 32 - size - 1)
        draw(d, s2, COLORS[c2], (x2, y2, x2 + size, y2 + size))
    else:
        x = rng.randint(2, 32 - size - 2)
        x2 = min(max(x + rng.randint(-3, 3), 1), 32 - size - 1)
        draw(d, s1, COLORS[c1], (x, rng.randint(1, 3), x + size, rng.randint(1, 3) + size))
        y2 = rng.randint(17, 32 - size - 1)
        draw(d, s2, COLORS[c2], (x2, y2, x2 + size, y2 + size))
    return im, "a %s %s %s a %s %s" % (c1, s1, relation, c2, s2)


def main(out, n_train, n_eval, seed):
    rng = random.Random(int(seed))
    os.makedirs(os.path.join(out, "img"), exist_ok=True)
    for split, n in (("train", int(n_train)), ("eval", int(n_eval))):
        with open(os.path.join(out, split + ".jsonl"), "w") as f:
            for i in range(n):
                im, caption = render(rng)
                name = "%s_%05d.png" % (split, i)
                im.save(os.path.join(out, "img", name))
                f.write(json.dumps({"image": name, "caption": caption}) + "\n")
    words = ["a", "left", "of", "above"] + list(COLORS) + SHAPES
    with open(os.path.join(out, "vocab.txt"), "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:5])
