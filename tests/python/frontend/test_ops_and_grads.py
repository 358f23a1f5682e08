"""Every exposed op, forward and gradient, against Debian's PyTorch on the same inputs
(f32, within 1e-5 relative to the largest value), through mt.value_and_grad over a pytree."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import meshtrain as mt
from conftest import max_err, rand

# name: (meshtrain fn, torch fn, input shapes, input range)
UNARY = {
    "exp": (mt.exp, torch.exp), "tanh": (mt.tanh, torch.tanh), "sigmoid": (mt.sigmoid, torch.sigmoid),
    "silu": (mt.silu, F.silu), "gelu": (mt.gelu, F.gelu),
    "gelu_tanh": (lambda x: mt.gelu(x, approximate=True), lambda x: F.gelu(x, approximate="tanh")),
    "sin": (mt.sin, torch.sin), "square": (mt.square, torch.square), "erf": (mt.erf, torch.erf),
    "softmax": (lambda x: mt.softmax(x, axis=-1), lambda x: torch.softmax(x, -1)),
    "log_softmax": (lambda x: mt.log_softmax(x, 1), lambda x: torch.log_softmax(x, 1)),
    "sum_axis": (lambda x: mt.sum(x, axis=1, keepdims=True), lambda x: x.sum(1, keepdim=True)),
    "mean": (lambda x: mt.mean(x, axis=(0, 2)), lambda x: x.mean((0, 2))),
    "max": (lambda x: mt.max(x, axis=-1), lambda x: x.amax(-1)),
    "logsumexp": (lambda x: mt.logsumexp(x, axis=-1), lambda x: torch.logsumexp(x, -1)),
    "reshape_T": (lambda x: mt.reshape(x, (4, 15)).T, lambda x: x.reshape(4, 15).T),
    "transpose": (lambda x: mt.transpose(x, (2, 0, 1)), lambda x: x.permute(2, 0, 1)),
    "index": (lambda x: x[:, 1:3, -1], lambda x: x[:, 1:3, -1]),
    "concat": (lambda x: mt.concatenate([x, x * 2], axis=1), lambda x: torch.cat([x, x * 2], 1)),
    "layer_norm": (lambda x: mt.layer_norm(x, eps=1e-5), lambda x: F.layer_norm(x, (5,), eps=1e-5)),
    "rms_norm": (lambda x: mt.rms_norm(x), lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)),
}


def check_against_torch(report, name, mt_fn, torch_fn, inputs, seed=0):
    """The loss sum(f(inputs) * r) through both: value and every input's gradient."""
    params = {f"x{i}": mt.array(a) for i, a in enumerate(inputs)}
    out_shape = np.asarray(mt_fn(*params.values())).shape
    r = rand(out_shape, 100 + seed)

    def loss(p):
        return mt.sum(mt_fn(*p.values()) * mt.array(r))

    value, grads = mt.value_and_grad(loss)(params)
    ts = [torch.tensor(a, requires_grad=True) for a in inputs]
    tv = (torch_fn(*ts) * torch.tensor(r)).sum()
    tv.backward()
    scale = max(1.0, float(np.max(np.abs(np.asarray(mt_fn(*params.values()))))))
    assert report(f"{name} value", max_err(value, tv)) <= 1e-5 * max(scale, abs(float(tv)))
    for i, t in enumerate(ts):
        g = grads[f"x{i}"]
        gscale = max(1.0, float(t.grad.abs().max()))
        assert report(f"{name} grad x{i}", max_err(g, t.grad)) <= 1e-5 * gscale, name


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops_and_gradients_match_torch(report, name):
    mt_fn, torch_fn = UNARY[name]
    check_against_torch(report, name, mt_fn, torch_fn, [rand((3, 4, 5), 1)])


def test_binary_matmul_and_losses_match_torch(report):
    a, b = rand((3, 4), 2), rand((4, 5), 3)
    check_against_torch(report, "matmul", mt.matmul, torch.matmul, [a, b])
    check_against_torch(report, "div", lambda x, y: x / y, lambda x, y: x / y, [a, rand((3, 4), 4, 0.5, 2)])
    check_against_torch(report, "where", lambda x, y: mt.where(x > 0, x, y), lambda x, y: torch.where(x > 0, x, y),
                        [a, rand((3, 4), 5)])
    w, bias = rand((5,), 6), rand((5,), 7)
    check_against_torch(report, "layer_norm affine", lambda x, w, b: mt.layer_norm(x, w, b),
                        lambda x, w, b: F.layer_norm(x, (5,), w, b), [rand((2, 3, 5), 8), w, bias])
    labels = np.array([0, 4, 2, -100, 1, 3], dtype=np.int64)
    check_against_torch(report, "cross_entropy",
                        lambda z: mt.cross_entropy(z, mt.array(labels), label_smoothing=0.1),
                        lambda z: F.cross_entropy(z, torch.tensor(labels), label_smoothing=0.1), [rand((6, 5), 9)])
    idx = np.array([2, 0, 2], dtype=np.int64)
    check_against_torch(report, "take", lambda t: mt.take(t, mt.array(idx), 0), lambda t: t[torch.tensor(idx)],
                        [rand((4, 3), 10)])


def test_numpy_batches_meet_parameters_as_engine_arrays(report):
    """A loss over a NumPy batch, written as README's: NumPy @ engine array is an engine array
    (the gradient flows through it), and the ops take NumPy arrays, as jax.numpy's do."""
    x, y = rand((6, 3), 11), rand((6, 2), 12)
    w = rand((3, 2), 13)

    def loss(p):
        return mt.mean(mt.square(mt.tanh(x @ p["w"]) - y))

    value, grads = mt.value_and_grad(loss)({"w": mt.array(w)})
    tw = torch.tensor(w, requires_grad=True)
    want = torch.mean(torch.square(torch.tanh(torch.tensor(x) @ tw) - torch.tensor(y)))
    want.backward()
    assert isinstance(x @ mt.array(w), mt.Array) and isinstance(x - mt.array(x), mt.Array)
    assert report("numpy @ engine loss", abs(float(value) - float(want))) <= 1e-6
    assert report("numpy @ engine grad", max_err(grads["w"], tw.grad)) <= 1e-6
    assert isinstance(np.exp(mt.array(x)), np.ndarray)  # other NumPy functions: on a host copy


def test_attention_matches_torch(report):
    q, k, v = rand((2, 3, 6, 8), 11), rand((2, 3, 6, 8), 12), rand((2, 3, 6, 8), 13)
    def torch_causal(q, k, v):  # torch 1.13 has no scaled_dot_product_attention
        scores = (q @ k.transpose(-1, -2)) / np.sqrt(q.shape[-1])
        mask = torch.ones(6, 6).tril().bool()
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v

    check_against_torch(report, "causal attention", lambda q, k, v: mt.attention(q, k, v, causal=True), torch_causal,
                        [q, k, v])


def test_dropout_is_inverted_and_reproducible_from_its_key():
    x = mt.ones((64, 64))
    key = mt.random.key(3)
    y1, y2 = np.asarray(mt.dropout(x, 0.25, key)), np.asarray(mt.dropout(x, 0.25, key))
    np.testing.assert_array_equal(y1, y2)
    assert set(np.unique(y1)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((y1 == 0).mean() - 0.25) < 0.03
    np.testing.assert_array_equal(np.asarray(mt.dropout(x, 0.25, key, training=False)), np.ones((64, 64)))


def test_value_and_grad_over_a_nested_pytree_with_aux(report):
    rng = np.random.default_rng(20)
    params = {"layers": [{"w": rng.normal(size=(4, 4)).astype(np.float32), "b": np.zeros(4, np.float32)}
                         for _ in range(2)], "scale": np.float32(0.5), "name": "mlp"}
    x = rand((3, 4), 21)

    def loss(p, x):
        h = mt.array(x)
        for layer in p["layers"]:
            h = mt.tanh(h @ layer["w"] + layer["b"])
        out = mt.sum(h * h) * p["scale"]
        return out, {"mean_h": mt.mean(h)}

    (value, aux), grads = mt.value_and_grad(loss, has_aux=True)(params, x)
    assert set(grads) == {"layers", "scale", "name"} and grads["name"] == "mlp"
    assert len(grads["layers"]) == 2 and set(grads["layers"][0]) == {"w", "b"}
    tp = {"layers": [{k: torch.tensor(v, requires_grad=True) for k, v in l.items()} for l in params["layers"]],
          "scale": torch.tensor(0.5, requires_grad=True)}
    h = torch.tensor(x)
    for layer in tp["layers"]:
        h = torch.tanh(h @ layer["w"] + layer["b"])
    tv = (h * h).sum() * tp["scale"]
    tv.backward()
    assert report("value", max_err(value, tv)) <= 1e-5
    assert report("aux", max_err(aux["mean_h"], h.mean())) <= 1e-6
    for i in range(2):
        for k in ("w", "b"):
            assert report(f"d/d layers.{i}.{k}", max_err(grads["layers"][i][k], tp["layers"][i][k].grad)) <= 1e-5
    assert report("d/d scale", max_err(grads["scale"], tp["scale"].grad)) <= 1e-5
    assert not hasattr(mt.grad(lambda p: mt.sum(p["w"]))({"w": np.ones(3, np.float32)})["w"], "grad")


def test_maml_second_order_gradient_matches_torch_create_graph(report):
    """The Redco paper's MAML step: outer loss at params - alpha * grad(inner loss)."""
    rng = np.random.default_rng(30)
    w1, w2 = rng.normal(size=(1, 16)).astype(np.float32), rng.normal(size=(16, 1)).astype(np.float32) * 0.3
    xs, ys = rand((8, 1), 31), rand((8, 1), 32)
    xq, yq = rand((8, 1), 33), rand((8, 1), 34)
    alpha = 0.1

    def inner(p, x, y):
        return mt.mean(mt.square(mt.tanh(mt.array(x) @ p["w1"]) @ p["w2"] - mt.array(y)))

    def outer(p):
        g = mt.grad(inner)(p, xs, ys)
        adapted = mt.tree_map(lambda w, gw: w - alpha * gw, p, g)
        return inner(adapted, xq, yq)

    value, grads = mt.value_and_grad(outer)({"w1": w1, "w2": w2})

    t = {"w1": torch.tensor(w1, requires_grad=True), "w2": torch.tensor(w2, requires_grad=True)}

    def tinner(p, x, y):
        return ((torch.tanh(torch.tensor(x) @ p["w1"]) @ p["w2"] - torch.tensor(y)) ** 2).mean()

    gi = torch.autograd.grad(tinner(t, xs, ys), [t["w1"], t["w2"]], create_graph=True)
    tv = tinner({"w1": t["w1"] - alpha * gi[0], "w2": t["w2"] - alpha * gi[1]}, xq, yq)
    tv.backward()
    assert report("outer loss", max_err(value, tv)) <= 1e-6
    for k in ("w1", "w2"):
        assert report(f"second-order d/d{k}", max_err(grads[k], t[k].grad)) <= 1e-5


def test_random_keys_are_explicit_and_reproducible():
    k = mt.random.key(7)
    a, b = mt.random.normal(k, (1000,)), mt.random.normal(k, (1000,))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    c = mt.random.normal(mt.random.fold_in(k, 1), (1000,))
    assert not np.array_equal(np.asarray(a), np.asarray(c))
    assert abs(float(np.asarray(a).mean())) < 0.1 and abs(float(np.asarray(a).std()) - 1) < 0.1
    u = np.asarray(mt.random.uniform(k, (500,), minval=2, maxval=3))
    assert u.min() >= 2 and u.max() < 3
