#!/usr/bin/env bash
# Tokenization throughput of `meshtrain prepare-data` against the number of processes: a
# corpus of COPIES documents (Tiny Shakespeare's 40,000 lines cut into pieces of 1,000 lines,
# repeated; "<|endoftext|>" between documents), tokenized with GPT-2's byte-level BPE by 1, 2,
# ... NP processes under mpirun. Prints tokens/s and the speed-up over one process, and checks that
# every run writes the same token stream.
#
#   bench/prepare_data_scaling.sh [DOCUMENTS=1600] [NP=2]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD:-$root/build}/apps/meshtrain/meshtrain"
copies="${1:-1600}"
max_np="${2:-2}"
tokenizer="$root/../shared/data/models/hf-tiny-gpt2/tokenizer.json"
work="$(mktemp -d /tmp/mt_prepare_scaling.XXXXXX)"
trap 'rm -rf "$work"' EXIT
split -l 1000 "$root/../shared/data/text/tinyshakespeare.txt" "$work/piece."
pieces=("$work"/piece.*)
for ((i = 0; i < copies; ++i)); do cat "${pieces[i % ${#pieces[@]}]}"; echo "<|endoftext|>"; done > "$work/corpus.txt"
mpi=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
isa=avx2
grep -q avx512f /proc/cpuinfo && isa=avx512
grep -q amx_bf16 /proc/cpuinfo && isa=avx512_core_amx
echo "prepare_data_scaling: cpu $isa, $(nproc) cores, corpus $(du -m "$work/corpus.txt" | cut -f1) MB ($copies documents of Tiny Shakespeare), GPT-2 BPE"
base=""
for ((np = 1; np <= max_np; ++np)); do
  out="$work/np$np"
  start=$(date +%s.%N)
  "${mpi[@]}" -np "$np" "$bin" prepare-data --data "$work/corpus.txt" --tokenizer "$tokenizer" --output "$out" > /dev/null
  secs=$(echo "$(date +%s.%N) - $start" | bc -l)
  tokens=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_tokens'])" "$out/index.json")
  stream=$(cat "$out"/shard_*.bin | md5sum | cut -d' ' -f1)
  rate=$(echo "$tokens / $secs" | bc -l)
  [ -z "$base" ] && base=$rate
  printf '  %d process(es): %d tokens in %.2f s = %.0f tokens/s (%.2fx), token stream md5 %s\n' "$np" "$tokens" "$secs" \
    "$rate" "$(echo "$rate / $base" | bc -l)" "$stream"
done
