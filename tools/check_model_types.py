#!/usr/bin/env python3
"""Fails when code outside the model registry switches on a model_type.

The registry (meshtrain/models/model_spec.*) is the one place that maps a config.json
"model_type" to what differs between architectures; everything else asks a ModelSpec (its
kind, its parameter roles, its config type). A comparison such as `model_type == "gpt2"` or
`== "bert"` elsewhere is a model that does not register itself.

    python3 tools/check_model_types.py [ROOT]      check ROOT (default: the repository)
    python3 tools/check_model_types.py --self-test prove that a comparison is caught
"""
import os
import re
import sys
import tempfile

MODELS = "bert|gpt2|llama|minigpt|t5|bart"
COMPARISON = re.compile(r'model_type\s*[=!]=|[=!]=\s*"(?:%s)"|"(?:%s)"\s*[=!]=' % (MODELS, MODELS))
ALLOWED = ("meshtrain/models/model_spec.cpp", "meshtrain/models/model_spec.h")
SOURCES = (".cpp", ".h", ".cu", ".cuh")


def violations(root):
    found = []
    for top in ("meshtrain", "apps", "examples"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                if rel in ALLOWED:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        if COMPARISON.search(line):
                            found.append("%s:%d: %s" % (rel, number, line.strip()))
    return found


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "meshtrain", "models"))
            with open(os.path.join(root, "meshtrain", "models", "planted.cpp"), "w") as f:
                f.write('bool conv1d(const Model& m) { return m.model_type == "gpt2"; }\n')
            found = violations(root)
            if len(found) != 1:
                print("self-test: the planted comparison was not caught: %s" % found)
                return 1
            print("self-test: caught %s" % found[0])
            return 0
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    found = violations(root)
    for v in found:
        print("model_type comparison outside the registry (ask the ModelSpec instead): " + v)
    if not found:
        print("no model_type comparisons outside meshtrain/models/model_spec.*")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
