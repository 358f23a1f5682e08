"""MAML (Finn et al. 2017) on few-shot sinusoid regression, written in Python with meshtrain:
the Redco paper's Figure 5 pipeline. Each task is y = A sin(x - phase) seen through K support
points; the loss adapts the parameters with one SGD step on them (an inner mt.grad) and scores
the adapted parameters on query points, so the meta-gradient the Trainer takes flows through
the inner gradient (second order).

    PYTHONPATH=build/python python3 examples/python/maml.py [steps=300] [workdir=runs/maml_py]

Exits non-zero when the post-adaptation loss on unseen tasks did not fall."""
import sys

import numpy as np

import meshtrain as mt

SHOTS, TASKS_PER_BATCH, INNER_LR, OUTER_LR = 10, 16, 0.01, 3e-3


def make_tasks(n, seed):
    rng = np.random.default_rng(seed)
    tasks = []
    for _ in range(n):
        amplitude, phase = rng.uniform(0.1, 5.0), rng.uniform(0, np.pi)
        x = rng.uniform(-5, 5, size=(2 * SHOTS, 1)).astype(np.float32)
        tasks.append({"x": x, "y": (amplitude * np.sin(x - phase)).astype(np.float32)})
    return tasks


def collate(tasks):  # list of tasks -> support and query arrays, (tasks, shots, 1)
    x, y = np.stack([t["x"] for t in tasks]), np.stack([t["y"] for t in tasks])
    return {"support_x": x[:, :SHOTS], "support_y": y[:, :SHOTS], "query_x": x[:, SHOTS:], "query_y": y[:, SHOTS:]}


def init_params(seed, hidden=40):
    rng = np.random.default_rng(seed)
    def dense(i, o):
        return {"w": (rng.normal(size=(i, o)) * np.sqrt(2.0 / i)).astype(np.float32), "b": np.zeros(o, np.float32)}
    return {"l1": dense(1, hidden), "l2": dense(hidden, hidden), "out": dense(hidden, 1)}


def net(p, x):
    h = mt.relu(x @ p["l1"]["w"] + p["l1"]["b"])
    h = mt.relu(h @ p["l2"]["w"] + p["l2"]["b"])
    return h @ p["out"]["w"] + p["out"]["b"]


def mse(p, x, y):
    return mt.mean(mt.square(net(p, x) - y))


def adapt(params, x, y):  # the inner SGD step: params - alpha * grad(inner loss)
    g = mt.grad(mse)(params, x, y)
    return mt.tree_map(lambda w, gw: w - INNER_LR * gw, params, g)


def loss_fn(params, batch, key, training):
    total = 0
    for t in range(batch["support_x"].shape[0]):
        adapted = adapt(params, batch["support_x"][t], batch["support_y"][t])
        total = total + mse(adapted, batch["query_x"][t], batch["query_y"][t])
    return total / batch["support_x"].shape[0]


def post_adaptation_loss(params, tasks):
    b = {k: mt.array(v) for k, v in collate(tasks).items()}
    return float(loss_fn(mt.tree_map(mt.array, params), b, None, False).item())


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    workdir = sys.argv[2] if len(sys.argv) > 2 else "runs/maml_py"
    deployer = mt.Deployer(workdir=workdir, seed=0, device="cpu", verbose=False)
    params = init_params(0)
    unseen = make_tasks(64, 1)
    before = post_adaptation_loss(params, unseen)
    trainer = mt.Trainer(deployer, collate, loss_fn, params, mt.optim.adam(OUTER_LR))
    trainer.fit(make_tasks(steps * TASKS_PER_BATCH, 2), per_device_batch_size=TASKS_PER_BATCH, epochs=1,
                progress=False, overwrite=True)  # a demo: a rerun starts over
    after = post_adaptation_loss(trainer.params, unseen)
    print(f"post-adaptation MSE on 64 unseen tasks: {before:.3f} before meta-training, {after:.3f} after "
          f"{trainer.step} steps")
    sys.exit(0 if after < 0.7 * before else 1)


if __name__ == "__main__":
    main()
