"""Hugging Face `transformers`' own model class as the twin of a meshtrain model: loads a
Hugging Face folder (config.json + model.safetensors, as meshtrain's save_pretrained wrote
it) into the class its config names, runs it in f32 without dropout on the inputs of
IN.safetensors and writes OUT.safetensors:
  logits, loss (shape [1]) and grad.<name> for every parameter (named_parameters' names:
  a tied weight appears once), the gradient of loss + sum(logits * cotangent); logits_f64,
  the same logits computed in f64 (rounded to f32 once): how far each f32 run is from exact.

  .venv/bin/python3 transformers_twin.py MODEL_DIR IN.safetensors OUT.safetensors

IN holds input_ids (or pixel_values, f32, for image models) and optionally attention_mask,
token_type_ids, position_ids, decoder_input_ids, decoder_attention_mask, encoder_attention_mask,
labels (integers), encoder_hidden_states and cotangent (f32, the logits' shape). Used by tests/oracle/transformers_twin_test.cpp.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

INPUT_KEYS = ["input_ids", "attention_mask", "token_type_ids", "position_ids", "decoder_input_ids",
              "decoder_attention_mask", "labels", "encoder_attention_mask"]
FLOAT_INPUT_KEYS = ["pixel_values", "encoder_hidden_states"]


def main():
    model_dir, in_path, out_path = sys.argv[1:4]
    with open(os.path.join(model_dir, "config.json")) as f:
        architecture = json.load(f)["architectures"][0]
    cls = getattr(transformers, architecture)
    # eager attention: the reference computation, no fused kernel of this torch
    model = cls.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()  # no dropout
    tensors = load_file(in_path)
    inputs = {k: tensors[k].long() for k in INPUT_KEYS if k in tensors}
    for k in FLOAT_INPUT_KEYS:  # image models; decoders with cross-attention
        if k in tensors:
            inputs[k] = tensors[k].float()
    out = model(**inputs, return_dict=True)
    total = out.logits.new_zeros(())
    result = {"logits": out.logits.detach().contiguous()}
    if out.loss is not None:
        total = total + out.loss
        result["loss"] = out.loss.detach().reshape(1)
    if "cotangent" in tensors:
        total = total + (out.logits * tensors["cotangent"]).sum()
    total.backward()
    try:
        with torch.no_grad():
            wide = {k: (v.double() if k in FLOAT_INPUT_KEYS else v) for k, v in inputs.items()}
            result["logits_f64"] = model.double()(**wide, return_dict=True).logits.float().contiguous()
    except RuntimeError as e:  # this transformers' BART builds f32 masks from f64's lowest value
        print(f"no f64 reference for {architecture}: {e}")
    for name, p in model.named_parameters():
        if p.grad is not None:
            result["grad." + name] = p.grad.detach().contiguous()
    save_file(result, out_path)
    grads = sum(k.startswith("grad.") for k in result)
    print(f"transformers {transformers.__version__} {architecture}: {grads} parameter gradients")


if __name__ == "__main__":
    main()
