#!/usr/bin/env bash
# Memory of pretraining from token shards does not grow with the corpus: synthetic shard
# directories of SMALL and LARGE bytes (random byte-tokenizer ids, uint16) are trained on for
# a few steps each, and the peak resident memory (/usr/bin/time) of each run is printed.
#
#   bench/shard_rss_bench.sh [LARGE_GB=2] [STEPS=20]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD:-$root/build}/apps/meshtrain/meshtrain"
large_gb="${1:-2}"
steps="${2:-20}"
work="$(mktemp -d /tmp/mt_shard_rss.XXXXXX)"
trap 'rm -rf "$work"' EXIT
# The byte tokenizer's files, from a tiny real prepare-data run.
printf 'To be, or not to be' > "$work/seed.txt"
"$bin" prepare-data --data "$work/seed.txt" --output "$work/seed" > /dev/null
make_shards() {  # DIR TOKENS: shards of 256 Mi tokens of random ids below 256
  /usr/bin/python3 - "$1" "$2" "$work/seed/tokenizer" <<'PY'
import json, os, shutil, sys
import numpy as np
out, total, tok = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(out, exist_ok=True)
shutil.copytree(tok, os.path.join(out, "tokenizer"))
rng, shards, left, per = np.random.default_rng(0), [], total, 1 << 28
while left > 0:
    n = min(per, left)
    name = "shard_r00000_%05d.bin" % len(shards)
    rng.integers(0, 256, n, dtype=np.uint16).astype("<u2").tofile(os.path.join(out, name))
    shards.append({"file": name, "tokens": n}); left -= n
json.dump({"format": "meshtrain-token-shards", "version": 1, "dtype": "uint16", "vocab_size": 257, "separator_id": 256,
           "num_tokens": total, "source": "synthetic", "shards": shards}, open(os.path.join(out, "index.json"), "w"))
PY
}
isa=avx2
grep -q avx512f /proc/cpuinfo && isa=avx512
grep -q amx_bf16 /proc/cpuinfo && isa=avx512_core_amx
echo "shard_rss_bench: cpu $isa, $steps steps of 16 x 128 tokens each"
for size in small large; do
  if [ "$size" = small ]; then tokens=$((8 << 20)); else tokens=$((large_gb * (1 << 30) / 2)); fi
  make_shards "$work/$size" "$tokens"
  /usr/bin/time -o "$work/rss_$size" -f '%M' "$bin" pretrain --data "$work/$size" --steps "$steps" --eval-fraction 0 \
    --output-dir "$work/run_$size" > /dev/null 2>&1
  rss=$(tail -1 "$work/rss_$size")
  echo "$size: $((tokens * 2 / (1 << 20))) MiB of shards ($tokens tokens): peak RSS $((rss / 1024)) MiB"
  rm -rf "$work/$size"
done
