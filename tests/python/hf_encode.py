"""Oracle of meshtrain's tokenizer conformance test: Hugging Face `tokenizers` (the 0.23 line,
installed apart in .venv/tokenizers-oracle by scripts/install-python-deps.sh) encodes the
inputs read from stdin and prints one JSON line per input.

  python3 hf_encode.py --json tokenizer.json            [options] < inputs.jsonl
  python3 hf_encode.py --wordpiece vocab.txt --lowercase 0|1 [options]
  python3 hf_encode.py --bpe encoder.json vocab.bpe     [options]
options: --max-length N --strategy longest_first|only_first|only_second
         --truncate-left --pad-to N --pad-longest --pad-left --pad-id N --no-special --decode --chunk N
         --no-mask (leave attention_mask out: it is all ones without padding)
         --decode-every K (decode only inputs whose index is a multiple of K)
Each input line is a JSON array: ["text"] or ["text a", "text b"] (JSON so that tabs, empty
strings and any Unicode survive). Each output line is
  {"ids": [...], "type_ids": [...], "attention_mask": [...], "decoded": "..."}
or {"error": "..."} when the library rejects the input (e.g. truncation impossible).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(sys.prefix, "tokenizers-oracle"))
from tokenizers import Tokenizer  # noqa: E402  (after the path of the oracle's own version)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--json")
    src.add_argument("--wordpiece")
    src.add_argument("--bpe", nargs=2, metavar=("ENCODER_JSON", "VOCAB_BPE"))
    p.add_argument("--lowercase", choices=["0", "1"], default="1")
    p.add_argument("--max-length", type=int)
    p.add_argument("--strategy", default="longest_first", choices=["longest_first", "only_first", "only_second"])
    p.add_argument("--truncate-left", action="store_true")
    p.add_argument("--pad-to", type=int)
    p.add_argument("--pad-longest", action="store_true")
    p.add_argument("--pad-left", action="store_true")
    p.add_argument("--pad-id", type=int, default=0)
    p.add_argument("--no-special", action="store_true")
    p.add_argument("--decode", action="store_true")
    p.add_argument("--decode-every", type=int)
    p.add_argument("--no-mask", action="store_true")
    p.add_argument("--chunk", type=int, default=2000)
    return p.parse_args()


def added(token_id, content):
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


# vocab.txt and encoder.json + vocab.bpe become the tokenizer.json Hugging Face's
# BertWordPieceTokenizer / GPT-2 tokenizer would save, so one loader covers all cases.
def wordpiece_json(path, lowercase):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    vocab = {}
    for i, line in enumerate(lines):
        vocab[line.rstrip()] = i
    special = [t for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if t in vocab]
    return {
        "version": "1.0",
        "added_tokens": [added(vocab[t], t) for t in special],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": lowercase},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", vocab["[SEP]"]], "cls": ["[CLS]", vocab["[CLS]"]]},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    }


def bpe_json(vocab_path, merges_path):
    with open(vocab_path, encoding="utf-8") as f:
        vocab = json.load(f)
    with open(merges_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    merges = [line for line in lines if not line.startswith("#version")]
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "added_tokens": [added(vocab["<|endoftext|>"], "<|endoftext|>")] if "<|endoftext|>" in vocab else [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": merges},
    }


def load(opt):
    if opt.json:
        return Tokenizer.from_file(opt.json)
    if opt.wordpiece:
        return Tokenizer.from_str(json.dumps(wordpiece_json(opt.wordpiece, opt.lowercase == "1")))
    return Tokenizer.from_str(json.dumps(bpe_json(*opt.bpe)))


def main():
    opt = parse_args()
    tok = load(opt)
    if opt.max_length is not None:
        tok.enable_truncation(opt.max_length, strategy=opt.strategy,
                              direction="left" if opt.truncate_left else "right")
    direction = "left" if opt.pad_left else "right"
    if opt.pad_to is not None or opt.pad_longest:
        tok.enable_padding(direction=direction, pad_id=opt.pad_id, length=opt.pad_to)
    add_special = not opt.no_special
    decode_every = opt.decode_every or 1
    decode = opt.decode or opt.decode_every is not None

    inputs = [json.loads(line) for line in sys.stdin.buffer.read().decode("utf-8").split("\n") if line]
    out = sys.stdout
    for start in range(0, len(inputs), opt.chunk):
        chunk = inputs[start:start + opt.chunk]
        batch = [(x[0], x[1]) if len(x) == 2 else x[0] for x in chunk]
        try:
            encodings = tok.encode_batch(batch, add_special_tokens=add_special)
        except Exception:
            # One rejected input fails the whole batch: encode this chunk one input at a
            # time, keeping the error per input.
            encodings = []
            for x in chunk:
                try:
                    encodings.append(tok.encode(x[0], x[1] if len(x) == 2 else None, add_special_tokens=add_special))
                except Exception as e:  # the library's own message
                    encodings.append(str(e))
            if opt.pad_longest:  # batch padding as encode_batch does it: all to the longest
                ok = [e for e in encodings if not isinstance(e, str)]
                longest = max((len(e.ids) for e in ok), default=0)
                for e in ok:
                    e.pad(longest, direction=direction, pad_id=opt.pad_id)
        decoded = [None] * len(encodings)
        if decode:
            want = [i for i, e in enumerate(encodings) if not isinstance(e, str) and (start + i) % decode_every == 0]
            texts = tok.decode_batch([encodings[i].ids for i in want], skip_special_tokens=True)
            for i, text in zip(want, texts):
                decoded[i] = text
        lines = []
        for e, d in zip(encodings, decoded):
            if isinstance(e, str):
                lines.append(json.dumps({"error": e}, ensure_ascii=False))
                continue
            r = {"ids": e.ids, "type_ids": e.type_ids}
            if not opt.no_mask:
                r["attention_mask"] = e.attention_mask
            if d is not None:
                r["decoded"] = d
            lines.append(json.dumps(r, ensure_ascii=False))
        if lines:
            out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
