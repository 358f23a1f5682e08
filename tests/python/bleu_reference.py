"""sacrebleu as the oracle of meshtrain's BLEU (tests/oracle/bleu_test.cpp).
Reads IN.json: {"cases": [{"name", "hypotheses": [...], "references": [[...], ...]}],
"lines": [...]} (references per hypothesis, any number each) and writes OUT.json with each
case's corpus BLEU (sacrebleu's defaults: 13a, exp smoothing) as {"score", "precisions",
"bp", "sys_len", "ref_len"} and "tokens": the 13a tokenization of every line.
usage: bleu_reference.py IN.json OUT.json
"""
import json
import sys

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a


def main(in_path, out_path):
    with open(in_path, encoding="utf-8") as f:
        spec = json.load(f)
    out = {"sacrebleu": sacrebleu.__version__, "cases": {}}
    for case in spec["cases"]:
        refs = case["references"]
        width = max(len(r) for r in refs)
        streams = [[r[k] if k < len(r) else None for r in refs] for k in range(width)]
        bleu = sacrebleu.corpus_bleu(case["hypotheses"], streams)
        out["cases"][case["name"]] = {"score": bleu.score, "precisions": bleu.precisions, "bp": bleu.bp,
                                      "sys_len": bleu.sys_len, "ref_len": bleu.ref_len}
    tokenize = Tokenizer13a()
    out["tokens"] = [tokenize(line.rstrip()) for line in spec["lines"]]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
