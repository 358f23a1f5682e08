"""mpirun -np 2 python3: the Python Trainer under data=2, model=2 and FSDP over data=2
equals one process (losses and trained parameters), as the C++ programs do."""
import json
import os
import shutil
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "spmd_trainer.py")


def run(tmp_path, mesh, fsdp, np_, grad_reduce_dtype="f32", rows="fixed", expect_ok=True):
    tag = f"{mesh}-{fsdp}-{np_}-{grad_reduce_dtype}-{rows}"
    out = tmp_path / f"{tag}.json"
    cmd = [sys.executable, SCRIPT, mesh, fsdp, str(out), str(tmp_path / f"run-{tag}"), grad_reduce_dtype, rows]
    if np_ > 1:
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            pytest.fail("mpirun (openmpi-bin) is not installed")
        extra = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        cmd = [mpirun, "--oversubscribe", *extra, "-np", str(np_), "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS"] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if not expect_ok:
        assert done.returncode != 0, "the run should have failed"
        return done.stdout + done.stderr
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.load(open(out))


@pytest.mark.parametrize("mesh,fsdp", [("data=2,model=1", "0"), ("data=1,model=2", "0"), ("data=2,model=1", "1")])
def test_two_processes_equal_one(tmp_path, mesh, fsdp):
    one = run(tmp_path, "data=1,model=1", "0", 1)
    two = run(tmp_path, mesh, fsdp, 2)
    worst = max(abs(a - b) / abs(b) for a, b in zip(two["losses"], one["losses"]))
    print(f"  [spmd] {mesh} fsdp={fsdp}: {len(two['losses'])} steps, loss {one['losses'][0]:.4f} -> "
          f"{one['losses'][-1]:.4f}, max rel diff vs one process {worst:.2e}")
    assert len(two["losses"]) == len(one["losses"]) == 8
    assert worst <= 1e-5
    for k, v in one["checksum"].items():
        assert abs(two["checksum"][k] - v) <= 1e-4 * max(1.0, abs(v)), k
    assert two["sharded"] == (mesh != "data=2,model=1" or fsdp == "1")


def test_bf16_gradient_reduction_stays_close_to_one_process(tmp_path):
    """Deployer(grad_reduce_dtype="bf16"): data-parallel gradients travel in bf16 (summed in
    f32); eight steps stay within bf16 rounding of the one-process losses, and another dtype
    is refused by name."""
    one = run(tmp_path, "data=1,model=1", "0", 1)
    two = run(tmp_path, "data=2,model=1", "0", 2, "bf16")
    worst = max(abs(a - b) / abs(b) for a, b in zip(two["losses"], one["losses"]))
    print(f"  [spmd] data=2 with bf16 gradients: max rel loss diff vs one process {worst:.2e}")
    assert len(two["losses"]) == 8
    assert worst <= 1e-3
    # f32 gradients give the one-process losses to ~1e-7 (above): a larger gap says bf16 travelled.
    assert worst > 1e-6, "the gradients did not travel in bf16"
    bad = subprocess.run([sys.executable, "-c", "import meshtrain as mt; mt.Deployer(grad_reduce_dtype='f16')"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "grad_reduce_dtype='f16'" in bad.stderr, bad.stderr[-2000:]


def test_rows_padded_to_their_longest_on_two_data_ranks_equal_one_process(tmp_path):
    """Rows of 4 to 32 tokens, each batch padded to its own longest row: the two data ranks'
    slices differ in length, and the Trainer's padded_fields pads them to the longer before
    each step, so they take the steps of one process (dropout on: the same shapes, the same
    masks). Without padded_fields the ranks stop with their shapes named."""
    one = run(tmp_path, "data=1,model=1", "0", 1, rows="ragged")
    two = run(tmp_path, "data=2,model=1", "0", 2, rows="ragged")
    worst = max(abs(a - b) / abs(b) for a, b in zip(two["losses"], one["losses"]))
    print(f"  [spmd] ragged rows on data=2: max rel loss diff vs one process {worst:.2e}")
    assert len(two["losses"]) == len(one["losses"]) == 8
    assert worst <= 1e-5
    for k, v in one["checksum"].items():
        assert abs(two["checksum"][k] - v) <= 1e-4 * max(1.0, abs(v)), k
    unnamed = run(tmp_path, "data=2,model=1", "0", 2, rows="ragged-unnamed", expect_ok=False)
    assert "the batch differs between ranks" in unnamed, unnamed[-3000:]
