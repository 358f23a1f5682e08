#!/usr/bin/env python3
"""Fails when a lower layer of meshtrain includes a higher one.

The layers, lowest first (docs/architecture.md, "Layers"). A file may include files of its
own layer and of the layers below it. The autodiff tape (autodiff/node.*) sits below the
dispatcher, which records onto it; the rest of autodiff (backward pass, value_and_grad) sits
above ops.

    python3 tools/check_layers.py [ROOT]      check ROOT (default: the repository)
    python3 tools/check_layers.py --self-test prove that a violation is caught
"""
import os
import re
import sys
import tempfile

LAYERS = [
    ("core", ["meshtrain/core/"]),
    ("backend", ["meshtrain/backend/"]),
    ("layout", ["meshtrain/layout/"]),
    ("tape", ["meshtrain/autodiff/node."]),
    ("prim", ["meshtrain/prim/"]),
    ("ops", ["meshtrain/ops/"]),
    ("autodiff", ["meshtrain/autodiff/"]),
    ("distributed", ["meshtrain/distributed/"]),
    ("optim", ["meshtrain/optim/"]),
    ("io", ["meshtrain/io/"]),
    ("data", ["meshtrain/data/"]),
    ("tokenizers", ["meshtrain/tokenizers/"]),
    ("models", ["meshtrain/models/"]),
    ("train", ["meshtrain/train/", "meshtrain/meshtrain.h"]),
    ("serve", ["meshtrain/serve/"]),
    ("posttrain", ["meshtrain/posttrain/"]),  # DPO, GRPO, distillation: training + generation
    ("apps", ["apps/", "python/"]),  # the CLI and the Python front end: everything below
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"(meshtrain/[^"]+)"', re.M)


def layer_of(path):
    # The most specific prefix wins (autodiff/node.* before autodiff/).
    best = None
    for index, (name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if path.startswith(prefix) and (best is None or len(prefix) > best[2]):
                best = (index, name, len(prefix))
    return best


def check(root):
    violations, unknown = [], []
    for top in ("meshtrain", "apps", "python"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                mine = layer_of(rel)
                if mine is None:
                    unknown.append(rel)
                    continue
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for inc in INCLUDE.findall(text):
                    theirs = layer_of(inc)
                    if theirs is None:
                        unknown.append(inc)
                    elif theirs[0] > mine[0]:
                        violations.append(f"{rel} ({mine[1]}) includes {inc} ({theirs[1]})")
    for v in violations:
        print("layer violation:", v)
    for u in sorted(set(unknown)):
        print("file outside every layer (add it to tools/check_layers.py):", u)
    layers = " < ".join(name for name, _ in LAYERS)
    if violations or unknown:
        print(f"FAILED: {len(violations)} violation(s), {len(set(unknown))} unplaced file(s); layers: {layers}")
        return 1
    print(f"layers OK: {layers}")
    return 0


def self_test():
    with tempfile.TemporaryDirectory() as root:
        for rel, text in {
            "meshtrain/core/array.h": '#include "meshtrain/core/shape.h"\n',
            "meshtrain/core/shape.h": "",
            "meshtrain/distributed/spmd.h": '#include "meshtrain/core/array.h"\n',
        }.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as fh:
                fh.write(text)
        if check(root) != 0:
            print("self-test: a clean tree was rejected")
            return 1
        with open(os.path.join(root, "meshtrain/core/array.h"), "a") as fh:
            fh.write('#include "meshtrain/distributed/spmd.h"\n')
        if check(root) == 0:
            print("self-test: core including dist was not caught")
            return 1
    print("self-test OK: the planted violation was caught")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        sys.exit(self_test())
    sys.exit(check(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
