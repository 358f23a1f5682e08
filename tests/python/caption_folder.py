"""Captions of images by a saved captioner folder, as transformers reads it: its
VisionEncoderDecoderModel, ViTImageProcessor (preprocessor_config.json) and tokenizer, beam
search with NUM_BEAMS beams and at most MAX_NEW tokens. Prints one JSON list of captions.
usage: caption_folder.py MODEL_DIR NUM_BEAMS MAX_NEW IMAGE...
"""
import json
import sys

import torch
import transformers.generation.utils as generation_utils
from PIL import Image
from transformers import AutoTokenizer, ViTImageProcessor, VisionEncoderDecoderModel

# Debian's torch 1.13 cannot import torch.distributed.fsdp under Python 3.11; nothing is FSDP here.
generation_utils.is_fsdp_managed_module = lambda module: False


def main(model_dir, beams, max_new, images):
    model = VisionEncoderDecoderModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    processor = ViTImageProcessor.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    captions = []
    with torch.no_grad():
        for path in images:
            pixels = processor(Image.open(path).convert("RGB"), return_tensors="pt").pixel_values
            out = model.generate(pixels, num_beams=int(beams), max_new_tokens=int(max_new))
            captions.append(tokenizer.decode(out[0], skip_special_tokens=True).strip())
    print(json.dumps(captions))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
