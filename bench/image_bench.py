"""The PIL + transformers side of image_bench: images per second on one core, from bytes in
memory, of Image.open(...).convert("RGB") (decode) and ViTImageProcessor's defaults (224x224
bilinear, rescale, normalize; preprocess), and both.
usage: image_bench.py [--seconds S] FILE...
"""
import io
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import PIL  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import ViTImageProcessor  # noqa: E402


def rate(n, seconds, work):
    start = time.perf_counter()
    done = 0
    while time.perf_counter() - start < seconds:
        work(done % n)
        done += 1
    return done / (time.perf_counter() - start)


def main():
    args = sys.argv[1:]
    seconds = 3.0
    if args[:1] == ["--seconds"]:
        seconds, args = float(args[1]), args[2:]
    blobs = [open(p, "rb").read() for p in args]
    processor = ViTImageProcessor()
    decoded = [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]

    def decode(i):
        return Image.open(io.BytesIO(blobs[i])).convert("RGB")

    def preprocess(i):
        return processor(decoded[i], return_tensors="np")["pixel_values"]

    def both(i):
        return processor(decode(i), return_tensors="np")["pixel_values"]

    d, p, b = rate(len(blobs), seconds, decode), rate(len(blobs), seconds, preprocess), rate(len(blobs), seconds, both)
    print("PIL %s + transformers %s, 1 core: decode %.1f img/s, preprocess %.1f img/s, both %.1f img/s"
          % (PIL.__version__, transformers.__version__, d, p, b))


if __name__ == "__main__":
    main()
