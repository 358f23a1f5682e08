#!/usr/bin/env bash
# Installs bench/requirements-peers.txt into .venv-bench (Debian's /usr/bin/python3, no system
# site packages: its own numpy 2 and PyTorch). Idempotent: a stamp holding the file's checksum
# skips the work when nothing changed. About 5 GB (PyTorch's CUDA wheels come with it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MT_BENCH_VENV:-$root/.venv-bench}"
req="$root/bench/requirements-peers.txt"
stamp="$venv/.meshtrain-requirements"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python3" ]; then exit 0; fi
[ -x "$venv/bin/python3" ] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/python3" -m pip --disable-pip-version-check -q install --no-deps -r "$req"
"$venv/bin/python3" -c 'import torch, jax, flax, optax, redco, transformers; print("bench peers: torch", torch.__version__, "jax", jax.__version__, "flax", flax.__version__, "redco ok")'
echo "$want" > "$stamp"
