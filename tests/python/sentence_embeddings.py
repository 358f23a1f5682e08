"""The references of the pretrained-BERT test (tests/oracle/pretrained_minilm_test.cpp) on a
sentence-transformers folder such as all-MiniLM-L6-v2:
  - transformers' AutoModel: last_hidden_state on the given input_ids / attention_mask, in
    f32 and in f64 (the exact value, rounded to f32 once, to say how far each f32 run is);
  - sentence-transformers: encode(texts), its own tokenization, pooling and normalization;
  - the ids and mask its tokenizer gives the texts (padded to the longest).

  .venv/bin/python3 sentence_embeddings.py MODEL_DIR TEXTS.json IN.safetensors OUT.safetensors
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file
from sentence_transformers import SentenceTransformer
from transformers import AutoModel


def main():
    model_dir, texts_path, in_path, out_path = sys.argv[1:5]
    with open(texts_path, encoding="utf-8") as f:
        texts = json.load(f)
    inputs = load_file(in_path)
    encoder = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    feed = {"input_ids": inputs["input_ids"].long(), "attention_mask": inputs["attention_mask"].long()}
    with torch.no_grad():
        hidden = encoder(**feed).last_hidden_state
        hidden64 = encoder.double()(**feed).last_hidden_state
    st = SentenceTransformer(model_dir, device="cpu")
    emb = st.encode(texts, batch_size=32, convert_to_tensor=True, normalize_embeddings=False)
    features = st.tokenize(texts)
    save_file({"last_hidden_state": hidden.contiguous(), "last_hidden_state_f64": hidden64.float().contiguous(),
               "embeddings": emb.float().contiguous(),
               "input_ids": features["input_ids"].long().contiguous(),
               "attention_mask": features["attention_mask"].long().contiguous()}, out_path)
    print(f"transformers f32 vs f64: max |err| {(hidden.double() - hidden64).abs().max().item():.3g} "
          f"of max |h| {hidden64.abs().max().item():.3g}; sentence-transformers: {len(texts)} texts, modules {[type(m).__name__ for m in st]}, "
          f"max_seq_length {st.max_seq_length}")


if __name__ == "__main__":
    main()
