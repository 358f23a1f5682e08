#!/usr/bin/env bash
# What the largest model costs in memory, side by side with PyTorch on the same shape: full
# fp32 AdamW training of GPT-2 Large (774M parameters: n_embd 1280, 36 layers, 20 heads, the
# GPT-2 vocabulary), one sequence of 512 tokens, blocks recomputed in backward, a few steps.
# Per run: the process's peak resident memory (/usr/bin/time; meshtrain's includes its final
# checkpoint and the exported model), meshtrain's host-array peak (metrics.jsonl) and bytes
# per parameter; then meshtrain's --dry-run figure for the same run, FSDP over 2 processes
# (each rank's peak), bf16 mixed precision, and PyTorch (Debian's python3-torch, same thread
# count) with and without torch.utils.checkpoint.
#
#   bench/memory_bench.sh [STEPS=3]      (about 20 minutes on 2 cores; needs ~21 GB free)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD:-$root/build}/apps/meshtrain/meshtrain"
steps="${1:-3}"
threads="$(nproc)"
work="$(mktemp -d /tmp/mt_memory_bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tok"
cp "$root/../shared/data/tokenizers/gpt2-encoder.json" "$work/tok/vocab.json"
cp "$root/../shared/data/tokenizers/gpt2-vocab.bpe" "$work/tok/merges.txt"
echo '{"n_embd": 1280, "n_layer": 36, "n_head": 20}' > "$work/large.json"
flags=(pretrain --model gpt2 --config "$work/large.json" --tokenizer "$work/tok" --seq-len 512
       --per-device-batch-size 1 --steps "$steps" --remat full --sample-every 0)

report() {  # NAME RSS_KIB PARAMETERS [METRICS_FILE]
  local line
  line="$1: peak RSS $(awk -v k="$2" -v n="$3" 'BEGIN { printf "%.2f GB (%.1f bytes/parameter)", k * 1024 / 1e9, k * 1024 / n }')"
  if [ -n "${4:-}" ] && [ -f "$4" ]; then
    line="$line, host arrays at most $(/usr/bin/python3 -c "import json,sys
print('%.2f GB' % max(json.loads(l).get('host_peak_gb', 0) for l in open(sys.argv[1])))" "$4")"
  fi
  echo "$line"
}
parameters() { grep -o '([0-9]* parameters)' "$1" | head -1 | tr -dc '0-9'; }

run_meshtrain() {  # NAME EXTRA_FLAGS...
  local name="$1"
  shift
  rm -rf "$work/run"
  /usr/bin/time -o "$work/rss" -f '%M' "$bin" "${flags[@]}" --output-dir "$work/run" "$@" > "$work/log" 2>&1 ||
    { tail -5 "$work/log"; exit 1; }
  report "$name" "$(tail -1 "$work/rss")" "$(parameters "$work/log")" "$work/run/metrics.jsonl"
}

# The dry run first: its output also names the CPU's ISA as meshtrain's kernels see it.
rm -rf "$work/run"
"$bin" "${flags[@]}" --output-dir "$work/run" --dry-run > "$work/dry" 2>&1 || { tail -5 "$work/dry"; exit 1; }
echo "memory_bench: GPT-2 Large, B1 T512, fp32 AdamW, $steps steps, $threads threads, $(grep -o 'cpu: [^,]*' "$work/dry" | head -1)"
grep '^dry run' "$work/dry" | sed 's/^/meshtrain f32 /'
run_meshtrain "meshtrain f32" --precision f32
run_meshtrain "meshtrain bf16" --precision bf16

# FSDP over two processes: each rank's own peak.
rm -rf "$work/run"
mpirun=(mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
"${mpirun[@]}" bash -c '/usr/bin/time -o "$0/rss_$OMPI_COMM_WORLD_RANK" -f %M "$@"' "$work" \
  "$bin" "${flags[@]}" --fsdp --output-dir "$work/run" > "$work/log" 2>&1 || { tail -5 "$work/log"; exit 1; }
for r in 0 1; do
  report "meshtrain f32 --fsdp, 2 processes, rank $r" "$(tail -1 "$work/rss_$r")" "$(parameters "$work/log")"
done

for remat in 1 0; do
  out=$(TORCH_REMAT=$remat /usr/bin/python3 "$root/bench/torch_model_step.py" gpt2 1 512 0 "$steps" "$threads" f32 \
        50257,1280,20,36)
  read -r kib n version < <(echo "$out" | /usr/bin/python3 -c "import json,sys
j = json.loads(sys.stdin.read()); print(int(j['peak_rss_mb'] * 1024), j['parameters'], j['torch'])")
  report "pytorch $version f32$([ "$remat" = 1 ] && echo ', checkpointed blocks')" "$kib" "$n"
done
