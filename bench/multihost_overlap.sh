#!/usr/bin/env bash
# The bucketed gradient all-reduce's overlap with the backward pass, measured across hosts:
# two network-namespace hosts (tests/multihost/netns_cluster.sh) joined by a slowed link
# (netem 5 ms + RATE where the kernel has netem, else a RATE token bucket), one rank each,
# data parallel across them; the step time of spmd_step_bench's small GPT with 4 MiB buckets
# (all-reduces start during the backward pass) and with one bucket larger than all gradients
# (one all-reduce after it); 4 MiB buckets with bf16 on the wire (--grad-reduce-dtype bf16:
# half the bytes); and FSDP with f32 and bf16 gradients. Needs root (ip netns).
#
#   bench/multihost_overlap.sh [RATE=200mbit] [STEPS=3]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-$root/build}"
rate="${1:-200mbit}"
steps="${2:-3}"
script="$root/tests/multihost/netns_cluster.sh"
prefix="mtov$$h"
net=$((30 + $$ % 200))
trap '"$script" down "$prefix"' EXIT
"$script" check
"$script" up "$prefix" 2 "$net"
for h in 1 2; do echo "host $h link: $("$script" shape "${prefix}$h" 5ms "$rate")"; done
subnet="10.213.$net.0/24"
as_root=()
[ "$(id -u)" -eq 0 ] && as_root=(--allow-run-as-root)
for run in "4 f32 dp" "1024 f32 dp" "4 bf16 dp" "4 f32 fsdp" "4 bf16 fsdp"; do
  set -- $run
  bucket=$1 wire=$2 layout=$3
  echo "--- $layout, gradient buckets of $bucket MiB, $wire on the wire"
  ip netns exec "${prefix}1" mpirun "${as_root[@]}" --oversubscribe -np 2 --host "${prefix}1:1,${prefix}2:1" \
    --mca plm_rsh_agent "$script rsh" --mca btl tcp,self --mca btl_tcp_if_include "$subnet" \
    --mca oob_tcp_if_include "$subnet" -x OMP_NUM_THREADS=1 \
    "$build/bench/spmd_step_bench" "$steps" --layouts "$layout" --bucket-mb "$bucket" --grad-reduce-dtype "$wire"
done
