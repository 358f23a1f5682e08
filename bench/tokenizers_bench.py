"""Hugging Face `tokenizers` (PyPI, the conformance oracle's 0.23 line in .venv/tokenizers-oracle)
on the same texts as bench/tokenizer_bench.cpp, for a side-by-side. Prints one JSON line:
  {"inputs": N, "tokens": T, "seconds": S}
usage: .venv/bin/python3 tokenizers_bench.py TOKENIZER_JSON TEXTS_JSONL [REPEATS]
Single-threaded when run with TOKENIZERS_PARALLELISM=false (the library's own switch).
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(sys.prefix, "tokenizers-oracle"))
from tokenizers import Tokenizer  # noqa: E402

BATCH = 4096  # texts per encode_batch call, as in tokenizer_bench.cpp


def one_pass(tok, texts):
    t0 = time.perf_counter()
    tokens = 0
    for s in range(0, len(texts), BATCH):
        tokens += sum(len(e.ids) for e in tok.encode_batch(texts[s:s + BATCH]))
    return tokens, time.perf_counter() - t0


def main():
    tok_path, texts_path = sys.argv[1], sys.argv[2]
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    tok = Tokenizer.from_file(tok_path)
    with open(texts_path, encoding="utf-8") as f:
        texts = [json.loads(line) for line in f if line.strip()]
    best = min((one_pass(tok, texts) for _ in range(repeats)), key=lambda p: p[1])
    print(json.dumps({"inputs": len(texts), "tokens": best[0], "seconds": best[1]}))


if __name__ == "__main__":
    main()
