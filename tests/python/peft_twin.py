"""Hugging Face `peft` as the twin of meshtrain's PEFT adapters (tests/oracle/peft_interop_test.cpp).

  peft_twin.py logits BASE_DIR ADAPTER_DIR IN.safetensors OUT.safetensors
      PeftModel.from_pretrained(base, adapter): the logits on IN's input_ids (+ attention_mask).
  peft_twin.py make BASE_DIR ADAPTER_OUT IN.safetensors OUT.safetensors TASK R ALPHA TARGETS [rslora] [SAVE]
      get_peft_model(base, LoraConfig(... init_lora_weights=False)) with random A and B (and,
      for SEQ_CLS, the modules TARGETS-like comma list SAVE trained in full), saved with
      save_pretrained into ADAPTER_OUT; the logits on IN.

TASK is CAUSAL_LM or SEQ_CLS; a SEQ_CLS base is loaded as AutoModelForSequenceClassification
with as many labels as the adapter's saved classifier (logits) or 3 (make).
"""
import json
import os
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification


def load_base(base_dir, task, num_labels):
    if task == "SEQ_CLS":
        return AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=num_labels,
                                                                  torch_dtype=torch.float32,
                                                                  attn_implementation="eager")
    return AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32, attn_implementation="eager")


def saved_num_labels(adapter_dir):
    with safe_open(os.path.join(adapter_dir, "adapter_model.safetensors"), "pt") as f:
        for key in f.keys():
            if key.endswith("classifier.weight"):
                return f.get_slice(key).get_shape()[0]
    raise SystemExit(f"{adapter_dir}: a SEQ_CLS adapter without its classifier")


def logits_of(model, in_path):
    inputs = load_file(in_path)
    kwargs = {"input_ids": inputs["input_ids"].long()}
    if "attention_mask" in inputs:
        kwargs["attention_mask"] = inputs["attention_mask"].long()
    model.eval()
    with torch.no_grad():
        return model(**kwargs).logits.contiguous()


def main():
    mode, base_dir, adapter_dir, in_path, out_path = sys.argv[1:6]
    if mode == "logits":
        with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
            task = json.load(f).get("task_type") or "CAUSAL_LM"
        labels = saved_num_labels(adapter_dir) if task == "SEQ_CLS" else None
        model = PeftModel.from_pretrained(load_base(base_dir, task, labels), adapter_dir)
    elif mode == "make":
        task, r, alpha, targets = sys.argv[6], int(sys.argv[7]), float(sys.argv[8]), sys.argv[9].split(",")
        rest = sys.argv[10:]
        torch.manual_seed(3)
        base = load_base(base_dir, task, 3)
        config = LoraConfig(task_type=task, r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                            init_lora_weights=False, use_rslora="rslora" in rest,
                            modules_to_save=[m for a in rest if a.startswith("save=") for m in a[5:].split(",")] or None)
        model = get_peft_model(base, config)
        model.save_pretrained(adapter_dir)
    else:
        raise SystemExit(f"unknown mode {mode}")
    logits = logits_of(model, in_path)
    save_file({"logits": logits}, out_path)
    print(f"peft: {mode} {type(model.base_model.model).__name__}, logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
