"""Run by test_trainer.py: a fit whose loss is slowed down, to be interrupted with SIGINT;
prints each step's loss as 'loss STEP VALUE' (flushing) so the parent knows when to signal.

    interrupted_fit.py WORKDIR RESUME(0|1) OUT_JSON"""
import json
import sys
import time

import numpy as np

import meshtrain as mt
from test_trainer import collate, init_params, loss_fn, make_examples

workdir, resume, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
slow = not resume


def slow_loss(params, batch, key, training):
    if slow:
        time.sleep(0.1)
    return loss_fn(params, batch, key, training)


trainer = mt.Trainer(mt.Deployer(workdir=workdir, seed=2, device="cpu", verbose=False), collate, slow_loss,
                     init_params(3), mt.optim.adamw(1e-2))
print("started", flush=True)
try:
    result = trainer.fit(make_examples(64, 5), per_device_batch_size=4, epochs=2, resume=resume, progress=False)
except KeyboardInterrupt as e:
    print(f"KeyboardInterrupt: {e}", flush=True)
    json.dump({"interrupted": str(e), "step": trainer.step}, open(out, "w"))
    sys.exit(130)
json.dump({"losses": result["losses"], "step": trainer.step}, open(out, "w"))
