"""Images and what PIL and transformers make of them: the oracle of image_processor_test.

Writes OUT/images/*: the two photographs Debian's python3-sklearn ships (JPEG), crops of them
saved by PIL in several PNG and JPEG modes (RGB, RGBA, L, LA, palette with and without a
transparent entry, 16-bit and 1-bit grayscale, progressive and 4:4:4 JPEG, grayscale JPEG),
and a PNG rendered by rsvg-convert (cairo's encoder) where it is installed. Then
OUT/expected.safetensors holds, for each file F,
  decoded/F                 np.asarray(Image.open(F).convert("RGB"))            (H, W, 3) u8
  pixels/C/F                ViTImageProcessor(**configs[C])(that image).pixel_values[0]  f32
with OUT/configs.json holding the processor configurations C, and OUT/bad/cmyk.jpg (a CMYK
JPEG, which meshtrain refuses).
usage: vit_image_oracle.py OUT
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from PIL import Image
from safetensors.numpy import save_file
from transformers import ViTImageProcessor

SKLEARN_IMAGES = "/usr/lib/python3/dist-packages/sklearn/datasets/images"

CONFIGS = {
    "vit224": {},  # ViTImageProcessor's defaults: 224x224 bilinear, 1/255, mean = std = 0.5
    "imagenet_bicubic": {"size": {"height": 48, "width": 40}, "resample": 3,
                         "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]},
    "lanczos_up": {"size": {"height": 150, "width": 333}, "resample": 1},
    "box": {"size": {"height": 33, "width": 65}, "resample": 4},
    "hamming": {"size": {"height": 64, "width": 64}, "resample": 5},
    "nearest": {"size": {"height": 37, "width": 29}, "resample": 0},
    "no_normalize": {"size": 32, "do_normalize": False},
}


def make_images(root):
    os.makedirs(root, exist_ok=True)
    for name in ("china.jpg", "flower.jpg"):
        shutil.copy(os.path.join(SKLEARN_IMAGES, name), os.path.join(root, name))
    china = Image.open(os.path.join(SKLEARN_IMAGES, "china.jpg")).convert("RGB")
    flower = Image.open(os.path.join(SKLEARN_IMAGES, "flower.jpg")).convert("RGB")
    crop = china.crop((100, 50, 197, 111))  # 97 x 61
    crop.save(os.path.join(root, "rgb.png"))
    rgba = flower.crop((200, 100, 250, 180)).convert("RGBA")
    alpha = np.tile(np.linspace(0, 255, 50, dtype=np.uint8), (80, 1))
    rgba.putalpha(Image.fromarray(alpha))
    rgba.save(os.path.join(root, "rgba.png"))
    gray = china.crop((300, 200, 431, 289)).convert("L")
    gray.save(os.path.join(root, "gray.png"))
    gray.convert("LA").save(os.path.join(root, "gray_alpha.png"))
    pal = flower.crop((0, 0, 120, 90)).quantize(64)
    pal.save(os.path.join(root, "palette.png"))
    pal.save(os.path.join(root, "palette_trns.png"), transparency=3)
    wide = (np.asarray(gray, dtype=np.uint16) * 3).astype(np.uint16)  # up to 765: PIL clips at 255
    Image.fromarray(wide, mode="I;16").save(os.path.join(root, "gray16.png"))
    gray.convert("1").save(os.path.join(root, "bits.png"))
    china.crop((10, 10, 311, 210)).save(os.path.join(root, "progressive.jpg"), quality=80, progressive=True)
    flower.crop((5, 5, 156, 106)).save(os.path.join(root, "full_chroma.jpg"), quality=95, subsampling=0)
    gray.save(os.path.join(root, "gray.jpg"), quality=85)
    china.crop((0, 0, 7, 5)).save(os.path.join(root, "tiny.jpg"), quality=90)
    rsvg = shutil.which("rsvg-convert")
    if rsvg:
        svg = os.path.join(root, "shapes.svg")
        with open(svg, "w") as f:
            f.write('<svg xmlns="http://www.w3.org/2000/svg" width="90" height="70">'
                    '<rect x="5" y="8" width="30" height="30" fill="#3060d0"/>'
                    '<circle cx="62" cy="40" r="20" fill="#d03030" fill-opacity="0.7"/></svg>')
        subprocess.run([rsvg, "-o", os.path.join(root, "cairo.png"), svg], check=True)
        os.remove(svg)
    bad = os.path.join(os.path.dirname(root), "bad")
    os.makedirs(bad, exist_ok=True)
    crop.convert("CMYK").save(os.path.join(bad, "cmyk.jpg"))


def main(out):
    root = os.path.join(out, "images")
    make_images(root)
    tensors = {}
    for name in sorted(os.listdir(root)):
        image = Image.open(os.path.join(root, name)).convert("RGB")
        tensors["decoded/" + name] = np.ascontiguousarray(np.asarray(image, dtype=np.uint8))
        for cname, cfg in CONFIGS.items():
            processor = ViTImageProcessor(**cfg)
            pixels = processor(image, return_tensors="np")["pixel_values"][0]
            tensors["pixels/%s/%s" % (cname, name)] = np.ascontiguousarray(pixels.astype(np.float32))
    save_file(tensors, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "configs.json"), "w") as f:
        json.dump({c: ViTImageProcessor(**cfg).to_dict() for c, cfg in CONFIGS.items()}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
