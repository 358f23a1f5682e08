#!/usr/bin/env bash
# Hosts made of Linux network namespaces, for the multi-host tests: each "host" is a namespace
# with its own network stack, joined to the others by a veth pair on one bridge, with an
# address that exists only inside the namespaces (10.213.<net>.<i>/24). Open MPI launches its
# daemons into them through `rsh` below (its plm_rsh_agent) instead of ssh, and its TCP
# transport is the only way ranks on different hosts can talk.
#
#   netns_cluster.sh up PREFIX N NET     create PREFIX1..PREFIXN (needs root: ip netns)
#   netns_cluster.sh down PREFIX         remove everything named PREFIX* (also after a failure)
#   netns_cluster.sh rsh HOST CMD...     run CMD inside HOST (Open MPI's rsh agent)
#   netns_cluster.sh addr PREFIX I NET   print host I's address
#   netns_cluster.sh shape HOST DELAY RATE  slow HOST's link: netem (DELAY, e.g. 5ms, and RATE,
#                                        e.g. 200mbit) where the kernel has it, else tbf (RATE
#                                        alone); prints which
#   netns_cluster.sh check               exit 0 when namespaces can be made here, else print why
set -euo pipefail

cmd=${1:-}
shift || true

case "$cmd" in
  up)
    prefix=$1 n=$2 net=$3
    bridge="${prefix}br"
    ip link add "$bridge" type bridge
    ip link set "$bridge" up
    for i in $(seq 1 "$n"); do
      host="${prefix}${i}"
      ip netns add "$host"
      # veth: "<prefix><i>a" stays on the bridge, "<prefix><i>b" moves into the host as eth0.
      ip link add "${host}a" type veth peer name "${host}b"
      ip link set "${host}a" master "$bridge" up
      ip link set "${host}b" netns "$host"
      ip netns exec "$host" ip link set "${host}b" name eth0
      ip netns exec "$host" ip addr add "10.213.${net}.${i}/24" dev eth0
      ip netns exec "$host" ip link set eth0 up
      ip netns exec "$host" ip link set lo up
    done
    ;;
  down)
    prefix=$1
    for host in $(ip netns list | awk '{print $1}' | grep "^${prefix}" || true); do
      ip netns pids "$host" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
      ip netns del "$host" 2>/dev/null || true
    done
    rm -rf /tmp/mt_netns_"${prefix}"*
    for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^${prefix}" || true); do
      ip link del "$link" 2>/dev/null || true
    done
    ;;
  rsh)
    # Open MPI calls: <agent> HOST <orted command line as one or more words>.
    host=$1
    shift
    # Each host its own temporary directory: Open MPI's daemons keep session directories
    # there, named after the hostname, which every namespace shares.
    tmp="/tmp/mt_netns_${host}"
    mkdir -p "$tmp"
    exec ip netns exec "$host" env TMPDIR="$tmp" /bin/sh -c "$*"
    ;;
  addr)
    echo "10.213.$3.$2"
    ;;
  shape)
    host=$1 delay=$2 rate=$3
    if ip netns exec "$host" tc qdisc add dev eth0 root netem delay "$delay" rate "$rate" 2>/dev/null; then
      echo "netem delay $delay rate $rate"
    else
      # Kernels without sch_netem (some VMs): the rate limit alone, by a token bucket.
      ip netns exec "$host" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kbit latency 500ms
      echo "tbf rate $rate (no netem in this kernel: no added delay)"
    fi
    ;;
  check)
    if [ "$(id -u)" -ne 0 ]; then echo "not root: network namespaces need root"; exit 1; fi
    if ! command -v ip >/dev/null; then echo "no 'ip' command (Debian iproute2)"; exit 1; fi
    probe="mtprobe$$"
    if ! ip netns add "$probe" 2>/dev/null; then echo "'ip netns add' is not permitted here"; exit 1; fi
    ip netns del "$probe"
    if ! ip link add "${probe}br" type bridge 2>/dev/null; then echo "bridges cannot be made here"; exit 1; fi
    ip link del "${probe}br"
    ;;
  *)
    echo "usage: $0 up PREFIX N NET | down PREFIX | rsh HOST CMD... | addr PREFIX I NET | shape HOST DELAY RATE | check" >&2
    exit 2
    ;;
esac
