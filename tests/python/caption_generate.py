"""transformers' VisionEncoderDecoderModel.generate on a saved folder: the oracle of
meshtrain's generate_captions. Reads pixel_values from IN.safetensors and writes OUT.safetensors
with greedy (B, T) and beams (B, T): the new tokens of greedy search and of beam search with
NUM_BEAMS beams, max_new_tokens MAX_NEW, padded with -1 after the end.
usage: caption_generate.py MODEL_DIR IN.safetensors OUT.safetensors MAX_NEW NUM_BEAMS
"""
import sys

import torch
from safetensors.torch import load_file, save_file
import transformers.generation.utils as generation_utils
from transformers import VisionEncoderDecoderModel

# generate() asks whether the model is FSDP-managed, which imports torch.distributed.fsdp: Debian's
# torch 1.13 cannot import it under Python 3.11 (a dataclass with a mutable default). Nothing here
# is FSDP-managed.
generation_utils.is_fsdp_managed_module = lambda module: False


def new_tokens(sequences, eos):
    rows = []
    for seq in sequences.tolist():
        seq = seq[1:]  # the decoder start token
        if eos in seq:
            seq = seq[:seq.index(eos) + 1]
        rows.append(seq)
    width = max(len(r) for r in rows)
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.int64)


def main():
    model_dir, in_path, out_path, max_new, beams = sys.argv[1:6]
    model = VisionEncoderDecoderModel.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    pixels = load_file(in_path)["pixel_values"].float()
    eos = model.config.eos_token_id
    common = dict(max_new_tokens=int(max_new), do_sample=False, decoder_start_token_id=model.config.decoder_start_token_id,
                  eos_token_id=eos, pad_token_id=model.config.pad_token_id)
    with torch.no_grad():
        greedy = model.generate(pixels, num_beams=1, **common)
        beam = model.generate(pixels, num_beams=int(beams), **common)
    save_file({"greedy": new_tokens(greedy, eos), "beams": new_tokens(beam, eos)}, out_path)


if __name__ == "__main__":
    main()
