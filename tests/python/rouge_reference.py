"""Google's `rouge-score` package on (target, prediction) pairs, the oracle of
tests/oracle/rouge_score_oracle_test.cpp. Reads JSON lines [target, prediction] from stdin and
prints one JSON line per pair: {"stem": {...}, "plain": {...}}, each mapping rouge1, rouge2,
rougeL, rougeLsum to [precision, recall, fmeasure]."""
import json
import sys

from rouge_score import rouge_scorer

TYPES = ["rouge1", "rouge2", "rougeL", "rougeLsum"]


def main():
    scorers = {"stem": rouge_scorer.RougeScorer(TYPES, use_stemmer=True),
               "plain": rouge_scorer.RougeScorer(TYPES, use_stemmer=False)}
    for line in sys.stdin:
        if not line.strip():
            continue
        target, prediction = json.loads(line)
        out = {}
        for name, scorer in scorers.items():
            s = scorer.score(target, prediction)
            out[name] = {t: [s[t].precision, s[t].recall, s[t].fmeasure] for t in TYPES}
        print(json.dumps(out))


if __name__ == "__main__":
    main()
