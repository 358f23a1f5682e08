#!/usr/bin/python3
"""PyTorch oracle worker for meshtrain's C++ tests.

Protocol (stdin -> stdout, one request at a time):
  request:  one JSON header line, then little-endian float64 payload for every
            input tensor, then for every cotangent tensor, in order.
            {"code": str, "inputs": [{"shape", "dtype"}], "cotangents": [...],
             "torch_threads": int}
  response: one JSON header line, then float64 payload for outputs, then for
            every non-null grad.
            {"ok": true, "outputs": [{"shape", "dtype"}], "grads": [... | null]}
            {"ok": false, "error": "<traceback>"}
On startup one line {"ready": true, "torch": "<version>"} is written so the
client can tell "torch failed to import" apart from "request crashed".
"""

import json
import math
import os
import sys
import traceback

# Keep the protocol stream private: anything user code, torch or C extensions
# print to fd 1 must not corrupt responses, so fd 1 becomes stderr.
_proto_out = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
sys.stdout = sys.stderr
_proto_in = sys.stdin.buffer

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except Exception:  # report clearly; the client turns exit code 3 into a message
    traceback.print_exc()
    sys.stderr.write("torch_oracle: /usr/bin/python3 cannot import torch/numpy\n")
    sys.exit(3)

_F64 = np.dtype("<f8")

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class _ProtocolError(Exception):
    """Framing is lost; the worker cannot continue."""


def _read_exact(n):
    chunks = []
    while n > 0:
        chunk = _proto_in.read(n)
        if not chunk:
            raise _ProtocolError("unexpected EOF inside request payload")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _read_tensor(spec, payload, offset):
    shape = [int(d) for d in spec["shape"]]
    n = _numel(shape)
    values = np.frombuffer(payload, dtype=_F64, count=n, offset=offset * 8)
    dtype_name = spec.get("dtype", "float32")
    if dtype_name not in _DTYPES:
        raise ValueError("unsupported dtype %r" % dtype_name)
    # Convert from float64 inside torch so bf16/f16 rounding is torch's own.
    t = torch.from_numpy(values.astype(np.float64).reshape(shape))
    dtype = _DTYPES[dtype_name]
    t = (t != 0) if dtype is torch.bool else t.to(dtype)
    return t, offset + n


def _describe(t):
    if t.dtype not in _NAMES:
        raise TypeError("output dtype %s is not supported by the oracle" % t.dtype)
    return {"shape": list(t.shape), "dtype": _NAMES[t.dtype]}


def _to_bytes(t):
    return t.detach().to(torch.float64).contiguous().cpu().numpy().astype(_F64).tobytes()


def _as_outputs(out):
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    return [x if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in items]


def _handle(header, payload):
    torch.set_num_threads(max(1, int(header.get("torch_threads") or 1)))
    torch.manual_seed(0)

    input_specs = header.get("inputs", [])
    cot_specs = header.get("cotangents", [])
    want_grad = len(cot_specs) > 0

    offset = 0
    xs = []
    for spec in input_specs:
        t, offset = _read_tensor(spec, payload, offset)
        if want_grad and t.is_floating_point():
            t.requires_grad_(True)
        xs.append(t)
    cots = []
    for spec in cot_specs:
        t, offset = _read_tensor(spec, payload, offset)
        cots.append(t)

    ns = {"torch": torch, "F": F, "math": math, "np": np, "xs": xs}
    for i, t in enumerate(xs):
        ns["x%d" % i] = t
    exec(compile(header["code"], "<oracle code>", "exec"), ns)
    if "out" not in ns:
        raise NameError("oracle code must assign `out`")
    outputs = _as_outputs(ns["out"])

    grads = []
    if want_grad:
        if len(cots) != len(outputs):
            raise ValueError("got %d cotangents for %d outputs" % (len(cots), len(outputs)))
        diff_inputs = [i for i, t in enumerate(xs) if t.requires_grad]
        # Integer/bool outputs (argmax, masks) carry no gradient; skip them.
        pairs = [(o, c.to(o.dtype)) for o, c in zip(outputs, cots) if o.requires_grad]
        grads = [None] * len(xs)
        if diff_inputs and pairs:
            got = torch.autograd.grad(
                [o for o, _ in pairs],
                [xs[i] for i in diff_inputs],
                [c for _, c in pairs],
                allow_unused=True,
            )
            for i, g in zip(diff_inputs, got):
                grads[i] = g

    resp = {
        "ok": True,
        "outputs": [_describe(o) for o in outputs],
        "grads": [None if g is None else _describe(g) for g in grads],
    }
    body = [_to_bytes(o) for o in outputs] + [_to_bytes(g) for g in grads if g is not None]
    return resp, body


def _send(resp, body=()):
    _proto_out.write(json.dumps(resp).encode("utf-8") + b"\n")
    for chunk in body:
        _proto_out.write(chunk)
    _proto_out.flush()


def main():
    _send({"ready": True, "torch": torch.__version__})
    while True:
        line = _proto_in.readline()
        if not line:
            return 0  # client closed the pipe: normal shutdown
        try:
            header = json.loads(line)
            count = sum(_numel(s["shape"]) for s in header.get("inputs", []))
            count += sum(_numel(s["shape"]) for s in header.get("cotangents", []))
        except Exception:
            # Without a valid header the payload length is unknown, so framing
            # is lost; report and quit rather than misread later requests.
            _send({"ok": False, "error": "bad request header:\n" + traceback.format_exc()})
            return 2
        payload = _read_exact(count * 8)
        try:
            resp, body = _handle(header, payload)
        except Exception:
            resp, body = {"ok": False, "error": traceback.format_exc()}, ()
        _send(resp, body)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except _ProtocolError as e:
        sys.stderr.write("torch_oracle: %s\n" % e)
        sys.exit(2)
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(1)
