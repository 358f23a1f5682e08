"""Renders the image-classification task of tests/e2e/image_classify_e2e_test.cpp: 32x32 PNG
images of one shape (circle, square or triangle) of a random colour, size and position, in one
folder per class (torchvision's ImageFolder layout).
usage: render_shape_classes.py OUT N_TRAIN_PER_CLASS N_EVAL_PER_CLASS SEED
Writes OUT/train/<shape>/*.png and OUT/eval/<shape>/*.png."""
import os
import random
import sys

from PIL import Image, ImageDraw

SHAPES = ["circle", "square", "triangle"]


def render(rng, shape):
    im = Image.new("RGB", (32, 32), (245, 245, 245))
    d = ImageDraw.Draw(im)
    color = tuple(rng.randint(20, 220) for _ in range(3))
    size = rng.randint(10, 18)
    x, y = rng.randint(1, 31 - size), rng.randint(1, 31 - size)
    box = (x, y, x + size, y + size)
    if shape == "circle":
        d.ellipse(box, fill=color)
    elif shape == "square":
        d.rectangle(box, fill=color)
    else:
        d.polygon([(x + size / 2, y), (x + size, y + size), (x, y + size)], fill=color)
    return im


def main(out, n_train, n_eval, seed):
    rng = random.Random(int(seed))
    for split, n in (("train", int(n_train)), ("eval", int(n_eval))):
        for shape in SHAPES:
            os.makedirs(os.path.join(out, split, shape), exist_ok=True)
            for i in range(n):
                render(rng, shape).save(os.path.join(out, split, shape, "%05d.png" % i))


if __name__ == "__main__":
    main(*sys.argv[1:5])
