"""Shared helpers of the Python front end's tests: meshtrain from <build>/python (PYTHONPATH,
set by CTest), Debian's torch as the reference."""
import numpy as np
import pytest
import torch

import meshtrain as mt


def rand(shape, seed, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32)


def max_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = b.detach().numpy().astype(np.float64) if isinstance(b, torch.Tensor) else np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


@pytest.fixture
def report(request):
    """Prints each comparison's max error (pytest -s shows them; the CTest log keeps them)."""
    def emit(what, err):
        print(f"  [max err] {request.node.name} {what}: {err:.3g}")
        return err
    return emit
