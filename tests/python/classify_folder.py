"""Classes of images by a saved ViT classifier folder, as transformers reads it: its
ViTForImageClassification, ViTImageProcessor (preprocessor_config.json) and id2label. Prints
one JSON list of class names.
usage: classify_folder.py MODEL_DIR IMAGE...
"""
import json
import sys

import torch
from PIL import Image
from transformers import ViTForImageClassification, ViTImageProcessor


def main(model_dir, images):
    model = ViTForImageClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    processor = ViTImageProcessor.from_pretrained(model_dir)
    pixels = processor([Image.open(p).convert("RGB") for p in images], return_tensors="pt").pixel_values
    with torch.no_grad():
        ids = model(pixel_values=pixels).logits.argmax(-1).tolist()
    print(json.dumps([model.config.id2label[i] for i in ids]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
