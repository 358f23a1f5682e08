#!/usr/bin/env bash
# Installs every Debian package the build, tests and benches need. Idempotent:
# packages already present are skipped, so repeated runs cost one dpkg query.
set -euo pipefail

packages=(
  build-essential cmake ccache pkg-config
  libdnnl-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libutf8proc-dev libsentencepiece-dev
  # images: PNG and JPEG decoding (data/image_decode.h)
  libpng-dev libjpeg62-turbo-dev
  # meshtrain serve: the HTTP server
  libcpp-httplib-dev
  python3-torch python3-numpy python3-sklearn python3-scipy python3-protobuf python3-crcmod
  # jinja2: the chat template oracle of the tests (tests/support/render_chat_template.py)
  python3-jinja2
  # nltk: the Porter stemmer oracle of the ROUGE tests (tests/unit/rouge_test.cpp)
  python3-nltk
  # Debian's torch calls the system BLAS; without OpenBLAS that is the reference BLAS
  # (~5 GFLOP/s), which would make the PyTorch side of bench/ meaningless.
  libopenblas0-pthread
  # the project's virtual environment (.venv, scripts/install-python-deps.sh) and what its
  # PyPI packages take from Debian: Pillow (sentence-transformers), requests, PyYAML, tqdm,
  # regex, psutil, six (transformers, huggingface-hub, peft, rouge-score)
  python3-venv python3-pil python3-requests python3-yaml python3-tqdm python3-regex python3-psutil python3-six
  # sacrebleu (the BLEU oracle) takes colorama from Debian
  python3-colorama
  # the Python front end (python/): pybind11, Python's and DLPack's headers to build it, pytest to test it
  pybind11-dev python3-dev libdlpack-dev python3-pytest
  fortunes
  # rsvg-convert: the tests render the curves.svg pictures
  librsvg2-bin
  # /usr/bin/time: bench/shard_rss_bench.sh reads peak memory with it
  time
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
