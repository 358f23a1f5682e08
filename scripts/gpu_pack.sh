#!/bin/sh
# Packs what the GPU machine needs to run meshtrain's GPU tests and benchmark into one
# archive, .gpu/meshtrain-gpu.tar.xz (DESIGN §11): the meshtrain binary, the GPU test and
# bench binaries (stripped), their non-system shared libraries (oneDNN, Open MPI, utf8proc,
# sentencepiece, ...; the CUDA libraries are the GPU machine's own), the data the GPU tests
# read, and scripts/gpu_run.sh. Build first (cmake --build build). On the GPU machine:
#   tar -xJf .gpu/meshtrain-gpu.tar.xz -C /tmp && /tmp/meshtrain-gpu/gpu_run.sh [test|bench|examples|all]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
data=${DATA:-$root/../shared/data}
stage=$root/.gpu/meshtrain-gpu
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/data/text" "$stage/data/models" "$stage/data/glue" "$stage/data/tokenizers"

bins="$build/apps/meshtrain/meshtrain $(ls "$build"/tests/gpu_*_test 2>/dev/null || true)"
for b in model_step_bench attention_bench grpo_rollout_bench; do
  [ -x "$build/bench/$b" ] && bins="$bins $build/bench/$b"
done
for e in text_classifier causal_lm maml caption; do
  [ -x "$build/examples/example_$e" ] && bins="$bins $build/examples/example_$e"
done
# The Python front end (import meshtrain) and its examples, when built: run on the GPU by
# gpu_run.sh python (a Python of the same minor version is needed there).
if [ -d "$build/python/meshtrain" ]; then
  mkdir -p "$stage/python/meshtrain" "$stage/examples"
  cp "$build"/python/meshtrain/*.py "$build"/python/meshtrain/_meshtrain*.so "$stage/python/meshtrain/"
  strip --strip-unneeded "$stage"/python/meshtrain/_meshtrain*.so
  cp "$root"/examples/python/*.py "$stage/examples/"
  bins="$bins $(ls "$build"/python/meshtrain/_meshtrain*.so)"
fi
for b in $bins; do
  case "$b" in *.so) continue ;; esac
  cp "$b" "$stage/bin/"
  strip --strip-unneeded "$stage/bin/$(basename "$b")"
done
[ -f "$root/bench/torch_model_step.py" ] && cp "$root/bench/torch_model_step.py" "$stage/bin/"
[ -f "$root/bench/gpu_compare_pytorch.py" ] && cp "$root/bench/gpu_compare_pytorch.py" "$stage/bin/"

# Shared libraries the binaries need, except the C/C++ runtime (the GPU machine's is newer)
# and CUDA's (the GPU machine has its toolkit and driver).
for b in $bins; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libstdc++*|libgcc_s*|libdl.so*|libpthread*|librt.so*|ld-linux*|libz.so*|libcuda*|libcublas*|libudev*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done

cp "$data/text/tinyshakespeare.txt" "$stage/data/text/"
cp -r "$data/models/hf-tiny-bert" "$data/models/hf-tiny-gpt2" "$stage/data/models/"
cp -r "$data/glue/MRPC" "$data/glue/SST-2" "$stage/data/glue/"
cp "$data/tokenizers/bert-base-uncased-tokenizer.json" "$stage/data/tokenizers/"
# Two photographs (python3-sklearn's) for `gpu_run.sh caption`.
photos=/usr/lib/python3/dist-packages/sklearn/datasets/images
if [ -f "$photos/china.jpg" ]; then
  mkdir -p "$stage/data/images"
  cp "$photos/china.jpg" "$photos/flower.jpg" "$stage/data/images/"
fi
# llm.c's GPT-2 trainer, when built beside the project (bench/llmc_build.sh ... .gpu/llmc), for
# `gpu_run.sh llmc`; Tiny Shakespeare in its token-file format (a 256-int header: magic 20240520,
# version 1, the token count; then the GPT-2 ids as uint16), tokenized by meshtrain prepare-data.
llmc=${LLMC_BIN:-$root/.gpu/llmc/train_gpt2cu}
if [ -x "$llmc" ]; then
  cp "$llmc" "$stage/bin/"
  tok=$(mktemp -d)
  trap 'rm -rf "$tok"' EXIT
  cp "$data/tokenizers/gpt2-encoder.json" "$tok/vocab.json"
  cp "$data/tokenizers/gpt2-vocab.bpe" "$tok/merges.txt"
  "$build/apps/meshtrain/meshtrain" prepare-data --data "$data/text/tinyshakespeare.txt" --tokenizer "$tok" \
    --output "$tok/shards" > /dev/null
  mkdir -p "$stage/data/llmc"
  python3 - "$tok/shards" "$stage/data/llmc/tinyshakespeare_gpt2.bin" <<'PY'
import json, struct, sys
index = json.load(open(sys.argv[1] + "/index.json"))
assert index["dtype"] == "uint16" and len(index["shards"]) == 1, index
ids = open(sys.argv[1] + "/" + index["shards"][0]["file"], "rb").read()
assert len(ids) == 2 * index["num_tokens"]
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, index["num_tokens"], *([0] * 253)) + ids)
PY
  rm -rf "$tok"
fi
cp "$root/scripts/gpu_run.sh" "$stage/"
# One xz stream with a dictionary larger than the whole stage: every binary links the same
# CUDA kernels (tens of MB each), and a window that spans them all stores them once
# (64 MB with xz's default 8 MiB window, 27 MB with this one; unpacking needs 256 MiB).
tar -C "$root/.gpu" -cf - meshtrain-gpu | xz -c --lzma2=preset=6,dict=256MiB > "$root/.gpu/meshtrain-gpu.tar.xz"
rm -rf "$stage"
ls -la "$root/.gpu/meshtrain-gpu.tar.xz"
