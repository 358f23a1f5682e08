"""Run under mpirun by test_spmd.py (and alone for the one-process reference): a GPT-2 of a
small config trained by mt.Trainer on a mesh with the automatic sharding rules; rank 0 writes
the losses and a checksum of the gathered parameters as JSON.

    spmd_trainer.py MESH FSDP OUT_JSON WORKDIR [GRAD_REDUCE_DTYPE] [fixed|ragged|ragged-unnamed]

ragged: rows of 4 to 32 tokens, each batch padded to its longest row (ids 0, labels -100), the
Trainer told so (padded_fields): data ranks then pad their slices to the longer of the two.
ragged-unnamed: the same rows without padded_fields."""
import json
import sys

import numpy as np

import meshtrain as mt

mesh, fsdp, out, workdir = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4]
grad_reduce_dtype = sys.argv[5] if len(sys.argv) > 5 else "f32"
rows_kind = sys.argv[6] if len(sys.argv) > 6 else "fixed"
ragged = rows_kind.startswith("ragged")
config = {"model_type": "gpt2", "vocab_size": 256, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4,
          "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}
model, params = mt.models.init_model(config, mt.random.key(5))
rng = np.random.default_rng(0)
lengths = rng.integers(4, 33, size=64) if ragged else np.full(64, 32)
examples = [{"ids": rng.integers(1, 256, size=int(n), dtype=np.int64)} for n in lengths]


def collate(rows):
    width = max(len(r["ids"]) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    labels = np.full((len(rows), width), -100, dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r["ids"])] = r["ids"]
        labels[i, :len(r["ids"])] = r["ids"]
    return {"ids": ids, "labels": labels}


def loss_fn(p, batch, key, training):
    return model.loss(p, batch["ids"], batch["labels"], key=key, training=training)


deployer = mt.Deployer(mesh=mesh, workdir=workdir, seed=1, device="cpu", verbose=False,
                       grad_reduce_dtype=grad_reduce_dtype)
plan = mt.sharding_rules(deployer, params, model.param_roles(), fsdp=fsdp, fsdp_min_elements=1024)
trainer = mt.Trainer(deployer, collate, loss_fn, params, mt.optim.adamw(3e-3), sharding_rules=plan,
                     padded_fields={"ids": 0, "labels": -100} if rows_kind == "ragged" else None)
result = trainer.fit(examples, per_device_batch_size=16 // deployer.data_size, epochs=2, progress=False)
trained = trainer.params
checksum = {k: float(np.asarray(trained[k], dtype=np.float64).sum())
            for k in ("transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_proj.weight", "transformer.wte.weight")}
sharded = any(v.sharded for v in trained.values())
if deployer.is_main:
    with open(out, "w") as f:
        json.dump({"losses": result["losses"], "checksum": checksum, "sharded": sharded}, f)
