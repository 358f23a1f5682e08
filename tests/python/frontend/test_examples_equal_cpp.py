"""The Python Trainer is the C++ Trainer: examples/python/text_classifier.py and the C++
example_text_classifier (same data, model config, seed, schedule; their collate, loss and
predict written in each language) log the same loss at every step."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def step_losses(path):
    return [l["loss"] for l in map(json.loads, open(path)) if l.get("split") == "train" and "loss" in l]


def test_text_classifier_losses_equal_the_cpp_example(tmp_path):
    build = os.environ.get("MT_BUILD_DIR", os.path.join(ROOT, "build"))
    cxx = os.path.join(build, "examples", "example_text_classifier")
    if not os.path.exists(cxx):
        pytest.fail(f"{cxx} is not built")
    data = os.path.join(ROOT, "..", "shared", "data")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    a = subprocess.run([cxx, data, "30", "400", str(tmp_path / "cxx")], capture_output=True, text=True, env=env,
                       timeout=300)
    b = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", "text_classifier.py"), data, "30", "400",
                        str(tmp_path / "py")], capture_output=True, text=True, env=env, timeout=300)
    assert a.returncode == 0, a.stdout[-2000:] + a.stderr[-2000:]
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    cxx_losses, py_losses = step_losses(tmp_path / "cxx" / "metrics.jsonl"), step_losses(tmp_path / "py" / "metrics.jsonl")
    print(f"  [examples] C++ {cxx_losses[0]:.6f} -> {cxx_losses[-1]:.6f}, Python {py_losses[0]:.6f} -> "
          f"{py_losses[-1]:.6f} over {len(py_losses)} steps")
    assert len(cxx_losses) == len(py_losses) == 30
    assert py_losses == cxx_losses
