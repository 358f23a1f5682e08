"""Sentiment classification in Python: a small BERT, initialized from scratch, trained on the
first few thousand SST-2 sentences and evaluated on the dev set — examples/text_classifier.cpp's
program with its three functions (collate, loss, predict) written in Python.

    PYTHONPATH=build/python python3 examples/python/text_classifier.py [data_dir=../shared/data]
        [steps=300] [train_sentences=8000] [workdir=runs/text_classifier_py]

Runs unchanged under `mpirun -np 2` (each process collates half of every batch). Exits
non-zero when the training loss did not fall."""
import csv
import sys

import numpy as np

import meshtrain as mt

MAX_LEN = 64  # sentences are truncated to this many tokens
# The fields collate pads to its batch's longest row, and their pad values: data-parallel ranks
# collate their own slices, and the Trainer pads them to the ranks' longest.
PADDED_FIELDS = {"input_ids": 0, "attention_mask": 0}


def read_sst2(path):
    with open(path, newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [{"sentence": r["sentence"], "label": int(r["label"])} for r in rows]


def main():
    data_dir = sys.argv[1] if len(sys.argv) > 1 else "../shared/data"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    train_sentences = int(sys.argv[3]) if len(sys.argv) > 3 else 8000
    workdir = sys.argv[4] if len(sys.argv) > 4 else "runs/text_classifier_py"

    tokenizer = mt.Tokenizer.from_file(f"{data_dir}/tokenizers/bert-base-uncased-tokenizer.json")
    tokenizer.enable_truncation(MAX_LEN)
    tokenizer.enable_padding(pad_to_multiple_of=8)  # each batch to its longest sentence
    train = read_sst2(f"{data_dir}/glue/SST-2/train.tsv")[:train_sentences]
    dev = read_sst2(f"{data_dir}/glue/SST-2/dev.tsv")

    def collate(rows):  # [CLS] sentence [SEP], truncated to MAX_LEN, padded to the batch's longest
        ids, mask = tokenizer.encode_batch_with_mask([r["sentence"] for r in rows])
        return {"input_ids": np.array(ids, np.int64), "attention_mask": np.array(mask, np.int64),
                "labels": np.array([r["label"] for r in rows], np.int64)}

    config = {"model_type": "bert", "architectures": ["BertForSequenceClassification"],
              "vocab_size": tokenizer.vocab_size, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": MAX_LEN,
              "num_labels": 2}
    deployer = mt.Deployer(workdir=workdir, verbose=False)
    model, params = mt.models.init_model(config, deployer.init_key)

    def loss_fn(p, batch, key, training):  # dropout while training, none when evaluated
        logits = model.apply(p, batch["input_ids"], attention_mask=batch["attention_mask"], key=key,
                             training=training)
        return mt.cross_entropy(logits, batch["labels"])

    def pred_fn(p, batch):  # the most likely class of each sentence
        return {"label": mt.argmax(model.apply(p, batch["input_ids"], attention_mask=batch["attention_mask"]), -1)}

    lr = mt.optim.warmup_linear_decay_schedule(1e-3, steps // 10, steps)
    trainer = mt.Trainer(deployer, collate, loss_fn, params, mt.optim.adamw(lr),
                         sharding_rules=mt.sharding_rules(deployer, params, model.param_roles()),
                         padded_fields=PADDED_FIELDS)
    predictor = mt.Predictor(deployer, collate, pred_fn, lambda out: list(out["label"]), padded_fields=PADDED_FIELDS)
    losses = trainer.fit(train, per_device_batch_size=32 // deployer.data_size, epochs=1000, max_steps=steps,
                         overwrite=True)["losses"]  # a demo: a rerun starts over
    predicted = predictor.predict(dev, trainer.params, per_device_batch_size=64)
    accuracy = float(np.mean([int(p) == r["label"] for p, r in zip(predicted, dev)]))
    eval_loss = trainer.eval_loss(dev, per_device_batch_size=64)

    k = max(1, len(losses) // 5)  # single steps are noisy: compare fifths
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    deployer.log(f"train loss {first:.4f} -> {last:.4f} (mean of the first and last {k} steps)")
    deployer.log(f"dev accuracy {accuracy:.4f} on {len(dev)} sentences, dev loss {eval_loss:.4f}")
    if not last < first:
        deployer.log("error: the loss did not fall")
    sys.exit(0 if last < first else 1)


if __name__ == "__main__":
    main()
