"""meshtrain from Python: the C++ engine's arrays, ops and autodiff.

    import meshtrain as mt
    x = mt.array([[1.0, 2.0], [3.0, 4.0]])
    loss, grads = mt.value_and_grad(lambda p, x: mt.sum(mt.tanh(x @ p["w"])))({"w": w}, x)

Arrays live in the engine (``np.asarray(x)`` / ``x.numpy()`` copy them out); parameters are
pytrees (nested dicts, lists and tuples of arrays) as in JAX; errors from the engine are
``mt.Error`` (a ``ValueError``) carrying the C++ message, which names the op and the shapes.
"""
import builtins as _builtins
import functools as _functools
import numbers
import os as _os

import numpy as _np

from . import _meshtrain as _core
from ._meshtrain import Array, Error, from_dlpack

# ---- dtypes: meshtrain's names, and NumPy/JAX-style aliases -----------------------------
float32 = "f32"
bfloat16 = "bf16"
float16 = "f16"
int32 = "i32"
int64 = "i64"
bool_ = "bool"
_DTYPE_ALIASES = {
    "f32": "f32", "float32": "f32", "bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "float16": "f16",
    "i32": "i32", "int32": "i32", "i64": "i64", "int64": "i64", "bool": "bool",
}


def _dtype_name(dtype):
    if dtype is None:
        return None
    if isinstance(dtype, str):
        name = dtype
    else:
        name = _np.dtype(dtype).name
    if name not in _DTYPE_ALIASES:
        raise Error(f"[array] unknown dtype {dtype!r} (float32, bfloat16, float16, int32, int64, bool)")
    return _DTYPE_ALIASES[name]


def array(obj, dtype=None, device=None):
    """An engine array from a NumPy array, a (nested) list or a scalar; float64 becomes float32
    and Python ints int64, as the engine has no float64."""
    if isinstance(obj, Array):
        out = obj
    else:
        a = _np.asarray(obj)
        if a.dtype == _np.float64:
            a = a.astype(_np.float32)
        elif a.dtype.kind in "iu" and a.dtype.itemsize != 4:
            a = a.astype(_np.int64)
        out = _core.from_numpy(a, device or "")
    name = _dtype_name(dtype)
    if name is not None and name != out.dtype:
        out = _core.cast(out, name)
    if device is not None and out.device != device:
        out = out.to(device)
    return out


asarray = array


def _as_array(x, like=None):
    if isinstance(x, Array):
        return x
    if like is not None and isinstance(x, numbers.Number) and not isinstance(x, bool):
        return _core.scalar_like(like, float(x))
    return array(x)


def _promoted(arr, scalar):
    """An integer array meeting a fractional Python scalar becomes float32 (NumPy's promotion),
    instead of the scalar being truncated to the array's dtype."""
    if (isinstance(arr, Array) and arr.dtype in ("i32", "i64") and isinstance(scalar, numbers.Real)
            and not isinstance(scalar, numbers.Integral) and not float(scalar).is_integer()):
        return _core.cast(arr, "f32")
    return arr


def _binary(fn):
    def op(a, b):
        if not isinstance(a, Array) and isinstance(b, Array):
            b = _promoted(b, a)
            return fn(_as_array(a, b), b)
        a = _promoted(a, b)
        return fn(a, _as_array(b, a))
    return op


add = _binary(_core.add)
subtract = sub = _binary(_core.sub)
multiply = mul = _binary(_core.mul)
divide = div = _binary(_core.div)
power = _binary(_core.pow)
maximum = _binary(_core.maximum)
minimum = _binary(_core.minimum)
equal = _binary(_core.eq)
not_equal = _binary(_core.ne)
less = _binary(_core.lt)
less_equal = _binary(_core.le)
greater = _binary(_core.gt)
greater_equal = _binary(_core.ge)
logical_and = _binary(_core.logical_and)
logical_or = _binary(_core.logical_or)


def where(cond, a, b):
    like = a if isinstance(a, Array) else b
    return _core.where(_as_array(cond), _as_array(a, like), _as_array(b, like))


def matmul(a, b):
    return _core.matmul(_as_array(a), _as_array(b))


from ._meshtrain import (  # noqa: E402  (the ops under their C++ names)
    neg, exp, log, sqrt, rsqrt, tanh, abs, sign, square, reciprocal, erf, sin, cos, sigmoid, relu, silu, gelu,
    logical_not, stop_gradient, cast as _cast, sum, mean, max, min, logsumexp, argmax,
    transpose as _transpose, swapaxes, concatenate, stack, expand_dims, squeeze, take, take_along_axis,
    one_hot, embedding, softmax, log_softmax, layer_norm, rms_norm, cross_entropy, mse_loss, dropout, attention,
)


def _first_as_array(fn):
    """The op taking a NumPy array or a list as its first argument too, as jax.numpy's do."""
    @_functools.wraps(fn)
    def op(x, *args, **kwargs):
        return fn(_as_array(x), *args, **kwargs)
    return op


neg, exp, log, sqrt, rsqrt, tanh, abs, sign, square, reciprocal, erf, sin, cos, sigmoid, relu, silu, gelu = map(
    _first_as_array, (neg, exp, log, sqrt, rsqrt, tanh, abs, sign, square, reciprocal, erf, sin, cos, sigmoid, relu,
                      silu, gelu))
logical_not, sum, mean, max, min, logsumexp, argmax, softmax, log_softmax = map(
    _first_as_array, (logical_not, sum, mean, max, min, logsumexp, argmax, softmax, log_softmax))
swapaxes, expand_dims, squeeze = map(_first_as_array, (swapaxes, expand_dims, squeeze))

negative = neg


def cast(x, dtype):
    return _cast(x, _dtype_name(dtype))


astype = cast


def reshape(x, *shape):
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    return _core.reshape(x, [int(d) for d in shape])


def transpose(x, axes=None):
    if axes is None:
        axes = list(range(x.ndim))[::-1]
    return _transpose(x, [int(a) for a in axes])


def broadcast_to(x, shape):
    return _core.broadcast_to(x, [int(d) for d in shape])


def zeros(shape, dtype=float32):
    return _core.full([int(d) for d in shape], 0.0, _dtype_name(dtype))


def ones(shape, dtype=float32):
    return _core.full([int(d) for d in shape], 1.0, _dtype_name(dtype))


def full(shape, value, dtype=float32):
    return _core.full([int(d) for d in shape], float(value), _dtype_name(dtype))


# ---- indexing: basic slices (step 1), integers, ..., None, and integer-array gathers ------
def _getitem(x, key):
    if not isinstance(key, tuple):
        key = (key,)
    if _builtins.sum(k is Ellipsis for k in key) > 1:
        raise Error("[index] at most one '...' in an index")
    consumed = _builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if consumed > x.ndim:
        raise Error(f"[index] {consumed} indices for an array of {x.ndim} dims {x.shape}")
    advanced = _builtins.sum(1 for k in key if not (k is None or k is Ellipsis or isinstance(k, (slice, numbers.Integral))))
    if advanced > 1:
        # NumPy pairs several index arrays elementwise; taking them one after the other would
        # give their outer product instead: refused rather than silently different.
        raise Error("[index] more than one integer-array index (NumPy pairs them elementwise): index one axis at a time")
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (x.ndim - consumed))
        else:
            expanded.append(k)
    out, axis = x, 0
    for k in expanded:
        if k is None:
            out = expand_dims(out, axis)
            axis += 1
        elif isinstance(k, slice):
            start, stop, step = k.indices(out.shape[axis])
            if step != 1:
                idx = array(_np.arange(start, stop, step, dtype=_np.int64))
                out = take(out, idx, axis)
            elif (start, stop) != (0, out.shape[axis]):
                out = _core.slice(out, axis, start, _builtins.max(start, stop))
            axis += 1
        elif isinstance(k, numbers.Integral) and not isinstance(k, bool):
            n = out.shape[axis]
            i = int(k) + n if k < 0 else int(k)
            if not 0 <= i < n:
                raise Error(f"[index] index {int(k)} out of range for axis {axis} of size {n} (array {out.shape})")
            out = squeeze(_core.slice(out, axis, i, i + 1), axis)
        else:
            if not isinstance(k, Array):
                k = _np.asarray(k)
                if k.dtype == _np.bool_:
                    # A boolean mask selects the positions where it is true (NumPy's rule).
                    if k.ndim != 1 or k.shape[0] != out.shape[axis]:
                        raise Error(f"[index] boolean mask of shape {k.shape} for axis {axis} of size "
                                    f"{out.shape[axis]}: only a 1-d mask over one axis is supported")
                    k = _np.nonzero(k)[0]
                k = array(k.astype(_np.int64))
            elif k.dtype == "bool":
                raise Error("[index] a boolean mask must be given as a NumPy array or list, not an engine array")
            out = take(out, k, axis)
            axis += k.ndim
    return out


def _array_method(fn):
    return lambda self, *args, **kw: fn(self, *args, **kw)


Array.__add__ = lambda a, b: add(a, b)
Array.__radd__ = lambda a, b: add(b, a)
Array.__sub__ = lambda a, b: sub(a, b)
Array.__rsub__ = lambda a, b: sub(b, a)
Array.__mul__ = lambda a, b: mul(a, b)
Array.__rmul__ = lambda a, b: mul(b, a)
Array.__truediv__ = lambda a, b: div(a, b)
Array.__rtruediv__ = lambda a, b: div(b, a)
Array.__pow__ = lambda a, b: power(a, b)
Array.__rpow__ = lambda a, b: power(b, a)
Array.__matmul__ = lambda a, b: matmul(a, b)
Array.__rmatmul__ = lambda a, b: matmul(b, a)
Array.__neg__ = lambda a: neg(a)
Array.__lt__ = lambda a, b: less(a, b)
Array.__le__ = lambda a, b: less_equal(a, b)
Array.__gt__ = lambda a, b: greater(a, b)
Array.__ge__ = lambda a, b: greater_equal(a, b)
Array.__eq__ = lambda a, b: equal(a, b)
Array.__ne__ = lambda a, b: not_equal(a, b)
Array.__hash__ = object.__hash__
Array.__getitem__ = _getitem
Array.__array__ = lambda self, dtype=None, copy=None: (self.numpy() if dtype is None else self.numpy().astype(dtype))
# A NumPy array meeting an engine array in +, -, *, /, ** or @ gives an engine array, as with
# the engine array on the left (the gradient flows through it); any other NumPy function on
# an engine array works on a host copy and returns NumPy.
_ENGINE_UFUNCS = {_np.add: add, _np.subtract: sub, _np.multiply: mul, _np.true_divide: div, _np.power: power,
                  _np.matmul: matmul}


def _array_ufunc(self, ufunc, method, *inputs, **kwargs):
    if method == "__call__" and not kwargs and ufunc in _ENGINE_UFUNCS and len(inputs) == 2:
        return _ENGINE_UFUNCS[ufunc](*inputs)
    inputs = tuple(_np.asarray(x) if isinstance(x, Array) else x for x in inputs)
    return getattr(ufunc, method)(*inputs, **kwargs)


Array.__array_ufunc__ = _array_ufunc
_shape_repr = Array.__repr__


def _array_repr(self):
    """The values too, as NumPy, JAX and torch print them, for arrays small enough to read (a
    sharded array prints its shape only: its values would take a collective every rank joins)."""
    if self.sharded or self.size > 1000:
        return _shape_repr(self)
    values = _np.array2string(_np.asarray(self), separator=", ", prefix="meshtrain.Array(")
    return f"meshtrain.Array({values}, dtype={self.dtype}, device={self.device})"


Array.__repr__ = _array_repr
Array.__len__ = lambda self: self.shape[0]
Array.__iter__ = lambda self: (self[i] for i in range(self.shape[0]))
Array.__float__ = lambda self: float(self.item())
Array.__int__ = lambda self: int(self.item())
Array.__bool__ = lambda self: bool(self.item())
Array.T = property(lambda self: transpose(self))
# DLPack: torch.from_dlpack(x) shares x's memory; mt.from_dlpack(t) shares t's.
Array.__dlpack__ = lambda self, stream=None: _core.to_dlpack(self)
Array.__dlpack_device__ = lambda self: _core.dlpack_device(self)
Array.data_ptr = property(lambda self: _core.data_ptr(self))
Array.astype = _array_method(cast)
Array.reshape = _array_method(reshape)
Array.sum = _array_method(sum)
Array.mean = _array_method(mean)
Array.max = _array_method(max)


# ---- pytrees and autodiff ------------------------------------------------------------------
def _flatten(tree, prefix, leaves, spec_path):
    """Paths of the tree's array leaves (dict keys and list/tuple positions joined by '/')."""
    if isinstance(tree, dict):
        return {k: _flatten(v, f"{prefix}{k}/", leaves, spec_path) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [_flatten(v, f"{prefix}{i}/", leaves, spec_path) for i, v in enumerate(tree)]
        return tuple(items) if isinstance(tree, tuple) else items
    if isinstance(tree, (Array, _np.ndarray)) or (isinstance(tree, numbers.Number) and not isinstance(tree, bool)):
        path = prefix[:-1] if prefix else "."
        leaves[path] = array(tree)
        return _Leaf(path)
    return tree  # None, strings, flags: carried as they are, not differentiated


class _Leaf:
    __slots__ = ("path",)

    def __init__(self, path):
        self.path = path


def _unflatten(spec, values):
    if isinstance(spec, _Leaf):
        return values[spec.path]
    if isinstance(spec, dict):
        return {k: _unflatten(v, values) for k, v in spec.items()}
    if isinstance(spec, list):
        return [_unflatten(v, values) for v in spec]
    if isinstance(spec, tuple):
        return tuple(_unflatten(v, values) for v in spec)
    return spec


def tree_flatten(tree):
    """(leaves as {path: Array}, spec) of a pytree."""
    leaves = {}
    spec = _flatten(tree, "", leaves, None)
    return leaves, spec


def tree_unflatten(spec, leaves):
    return _unflatten(spec, leaves)


def tree_map(fn, tree, *rest):
    leaves, spec = tree_flatten(tree)
    others = [tree_flatten(t)[0] for t in rest]
    return _unflatten(spec, {k: fn(v, *(o[k] for o in others)) for k, v in leaves.items()})


def value_and_grad(fn, has_aux=False):
    """fn(params, *args) -> scalar (or (scalar, aux) with has_aux): returns a function giving
    (value, grads) or ((value, aux), grads), grads shaped like params. Calls nest: the gradient
    of a function that itself takes a gradient is exact (second order)."""
    def wrapped(params, *args, **kwargs):
        leaves, spec = tree_flatten(params)
        value, aux, grads = _core.value_and_grad_flat(
            lambda traced: fn(_unflatten(spec, traced), *args, **kwargs), leaves, has_aux)
        g = _unflatten(spec, grads)
        return ((value, aux), g) if has_aux else (value, g)
    return wrapped


def grad(fn, has_aux=False):
    def wrapped(params, *args, **kwargs):
        out, g = value_and_grad(fn, has_aux)(params, *args, **kwargs)
        return (g, out[1]) if has_aux else g
    return wrapped


# ---- the Redco layer: Deployer, Trainer, optimizers -------------------------------------
from ._meshtrain import Deployer, Tokenizer, data, metrics, models, optim, posttrain  # noqa: E402


def _init_model(config, key=None):
    """(model, params) of a config.json's content (a dict with its model_type), freshly
    initialized from key (seed, stream)."""
    import json
    return models._init_model(json.dumps(config), key)


models.init_model = _init_model


def _small_seq2seq_config(model_type, vocab_size, pad_id, eos_id):
    """A small encoder-decoder config of the family (2 + 2 layers, width 128), as a dict."""
    import json
    return json.loads(models._small_seq2seq_config(model_type, vocab_size, pad_id, eos_id))


models.small_seq2seq_config = _small_seq2seq_config


def _small_config(model_type, vocab_size, context, eos_id):
    """The family's small config for training from scratch (e.g. "vision-encoder-decoder": a
    4-layer ViT on 32x32 images in 8x8 patches and a 4-layer GPT-2), as a dict."""
    import json
    return json.loads(models._small_config(model_type, vocab_size, context, eos_id))


models.small_config = _small_config


# optax's interface over pytrees: state = opt.init(params);
# updates, state = opt.update(grads, state, params); params = mt.optim.apply_updates(params, updates)
def _opt_init(self, params):
    leaves, _ = tree_flatten(params)
    return self._init(leaves)


def _opt_update(self, grads, state, params):
    g, spec = tree_flatten(grads)
    p, _ = tree_flatten(params)
    updates, state = self._update(g, state, p)
    return _unflatten(spec, updates), state


def _apply_updates(params, updates):
    p, spec = tree_flatten(params)
    u, _ = tree_flatten(updates)
    return _unflatten(spec, optim._apply_updates(p, u))


def _lora_optimizer(inner, also_train=None):
    """inner on the LoRA adapters (and parameters matching the regex also_train), everything
    else frozen: no optimizer state and no gradients for the base weights."""
    pattern = models.lora_parameter_pattern()
    if also_train:
        pattern = f"(?:{pattern})|(?:{also_train})"
    return optim.partition([(pattern, inner), (".*", optim.freeze())])


optim.lora = _lora_optimizer
_core.Transform.init = _opt_init
_core.Transform.update = _opt_update
optim.apply_updates = _apply_updates


def sharding_rules(deployer, params, roles=None, fsdp=False, fsdp_min_elements=1 << 14):
    """The automatic sharding plan of params (a pytree) on the deployer's mesh: roles from a
    model (model.param_roles()) or {path: (kind, in_dim, out_dim)} with the pytree's paths
    ('layer/w'); fsdp also splits parameters of at least fsdp_min_elements over the data
    axis. Print it to see it."""
    leaves, _ = tree_flatten(params)
    return deployer._sharding_rules(leaves, roles, fsdp, fsdp_min_elements)


def _print_plan(deployer, params, roles=None, fsdp=False):
    """Prints (on rank 0) the plan's table: each parameter's shape, layout and bytes per rank."""
    deployer.log(sharding_rules(deployer, params, roles, fsdp).table())


Deployer.sharding_rules = sharding_rules
Deployer.print_plan = _print_plan


def _padded_field_groups(padded_fields):
    """None, {field: pad value} or a list of such dicts -> a list of {str: float} groups."""
    if padded_fields is None:
        return []
    groups = [padded_fields] if isinstance(padded_fields, dict) else list(padded_fields)
    for g in groups:
        if not isinstance(g, dict):
            raise TypeError(f"padded_fields: expected a dict of field -> pad value or a list of them, got {g!r}")
    return [{str(k): float(v) for k, v in g.items()} for g in groups]


def _refuse_earlier_checkpoints(workdir):
    checkpoints = _os.path.join(workdir, "checkpoints")
    if _os.path.isdir(checkpoints) and any(n.startswith("step_") or n == "best" for n in _os.listdir(checkpoints)):
        raise Error(f"[trainer] {checkpoints} holds checkpoints of an earlier run: fit(..., resume=True) continues it, "
                    "fit(..., overwrite=True) writes over it, or give the Deployer another workdir")


class Trainer:
    """Trains params (a pytree) with the C++ Trainer over Python functions, as Redco's:

        collate_fn(examples: list) -> dict of arrays (first dim = examples)
        loss_fn(params, batch, key, training) -> scalar (or (scalar, aux))

    fit() runs epochs or steps with the progress bar, metrics.jsonl, TensorBoard, curves.svg
    and checkpoints in the deployer's workdir, exactly as the C++ Trainer writes them; the
    GIL is released while the engine computes.

    precision: "f32", "tf32", "bf16" (f32 master weights, bf16 activations), "f16" (the same
    in half, with the loss scaled: loss_scale "dynamic" or a fixed number, the dynamic scale
    doubling after loss_scale_window finite steps) or "bf16-matmul", as the CLI's --precision.

    padded_fields: the batch fields collate_fn pads only to its rows' longest (padding="longest"),
    each with its pad value, e.g. {"input_ids": 0, "attention_mask": 0, "labels": -100}; or a
    list of such dicts, one per length the fields share (sources and targets). Each data rank
    collates its own slice, so the ranks pad these along axis 1 to the longest among them
    before each step; without them their shapes must agree."""

    def __init__(self, deployer, collate_fn, loss_fn, params, optimizer, sharding_rules=None, precision="f32",
                 loss_scale="dynamic", loss_scale_window=2000, padded_fields=None):
        leaves, self._spec = tree_flatten(params)
        spec = self._spec

        def flat_loss(flat, batch, key, training):
            return loss_fn(_unflatten(spec, flat), batch, key, training)

        self._trainer = _core._Trainer(deployer, collate_fn, flat_loss, leaves, optimizer, sharding_rules, precision,
                                       loss_scale, int(loss_scale_window))
        self._trainer._set_padded_fields(_padded_field_groups(padded_fields))
        self._workdir = deployer.workdir
        self._fitted = False

    def fit(self, examples, per_device_batch_size=8, epochs=1, max_steps=-1, eval_examples=None, eval_every=0,
            save_every=0, resume=False, shuffle=True, grad_accum_steps=1, progress=True, overwrite=False):
        """Returns {"losses": per step, "evals": [...], "steps": total optimizer steps}.

        A workdir holding checkpoints of an earlier run is refused at this Trainer's first fit,
        as the CLI refuses such an --output-dir: resume=True continues that run, overwrite=True
        writes over it (its metrics.jsonl and checkpoints are replaced)."""
        if not (resume or overwrite or self._fitted):
            _refuse_earlier_checkpoints(self._workdir)
        self._fitted = True
        return self._trainer.fit(list(examples), per_device_batch_size, epochs, max_steps,
                                 None if eval_examples is None else list(eval_examples), eval_every, save_every,
                                 resume, shuffle, grad_accum_steps, progress)

    def eval_loss(self, examples, per_device_batch_size=8):
        """The mean loss over every example (no dropout), on any number of processes."""
        return self._trainer.eval_loss(list(examples), per_device_batch_size)

    @property
    def params(self):
        return _unflatten(self._spec, self._trainer.params())

    @property
    def step(self):
        return self._trainer.step

    @property
    def last_step_metrics(self):
        """What the loss function recorded (posttrain.record_metric) in the last step: means
        over its micro-batches."""
        return self._trainer.last_step_metrics


class Predictor:
    """Runs pred_fn over examples in global batches, as Redco's Predictor:

        collate_fn(examples) -> dict of arrays;  pred_fn(params, batch) -> dict of arrays
        output_fn(dict of NumPy arrays, first dim = examples) -> one output per example

    predict(examples, params, per_device_batch_size) returns the outputs in the examples'
    order (the last batch's padding dropped). precision as the Trainer's (the parameters are
    cast once per call under bf16 and f16); padded_fields as the Trainer's."""

    def __init__(self, deployer, collate_fn, pred_fn, output_fn, precision="f32", padded_fields=None):
        self._pred_fn = pred_fn
        self._spec = None

        def flat_pred(flat, batch):
            return pred_fn(_unflatten(self._spec, flat), batch)

        self._predictor = _core._Predictor(deployer, collate_fn, flat_pred, output_fn, precision)
        self._predictor._set_padded_fields(_padded_field_groups(padded_fields))

    def predict(self, examples, params, per_device_batch_size=8):
        if isinstance(examples, dict) and not isinstance(params, dict):
            raise TypeError("Predictor.predict(examples, params, per_device_batch_size): the examples come first, as "
                            "in Redco (the C++ Predictor takes the parameters first); got a dict of parameters there")
        leaves, self._spec = tree_flatten(params)
        return list(self._predictor.predict(list(examples), leaves, per_device_batch_size))


class random:  # noqa: N801  (a namespace, as jax.random)
    """Counter-based random arrays from explicit keys: a key is an int seed or (seed, stream).
    A Trainer hands its loss (seed, stream, step): the step is folded in after every fold_in,
    as the C++ trainer's key does, and fold_in / split keep it."""

    @staticmethod
    def key(seed, stream=0):
        return (int(seed), int(stream))

    @staticmethod
    def fold_in(key, data):
        return _core.fold_in(key, int(data))

    @staticmethod
    def split(key, num=2):
        return [_core.fold_in(key, i) for i in range(num)]

    @staticmethod
    def normal(key, shape, dtype=float32):
        return _core.random_normal(key, [int(d) for d in shape], _dtype_name(dtype))

    @staticmethod
    def uniform(key, shape, dtype=float32, minval=0.0, maxval=1.0):
        return _core.random_uniform(key, [int(d) for d in shape], _dtype_name(dtype), float(minval), float(maxval))


__all__ = [n for n in dir() if not n.startswith("_")]
