#!/usr/bin/env bash
# Hierarchical gloo collectives across hosts made of network namespaces:
# each host is a namespace with its own address (10.79.0.<h+1>) on a bridge
# (in a namespace of its own, so nothing outside is touched) and its own
# hostname (a UTS namespace per host). Runs tools/examples/hier_hosts.rs once per
# rank, in two layouts: 2 hosts x 2 ranks (ranks 0,1 | 2,3) and 3 hosts of
# 2, 2 and 1 ranks, interleaved (ranks 0,3 | 1,4 | 2). Each run checks every
# covered collective, several dtypes and sizes, element by element and
# against the flat path, and prints the bytes that crossed between hosts
# (tx_bytes of each host's link) flat against hierarchical.
# Between hosts it runs Gloo over TCP (TORCHCOMM_HOST_TRANSPORT=gloo unless
# set): the byte counts compare the hierarchy with Gloo's flat path (UCX's
# flat path already keeps a host's own traffic inside the host, through its
# shared-memory transports; make ucx-hosts-test covers UCX between hosts).
# Needs root (ip netns); otherwise prints a SKIPPED line and exits 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
skip() { echo "test-hier-hosts: SKIPPED (hierarchical collectives over network namespaces): $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "not root (ip netns needs it)"
command -v ip >/dev/null || skip "the ip command (iproute2) is missing"
command -v unshare >/dev/null || skip "unshare (util-linux) is missing"
# The example comes with the build (scripts/build.sh; skipped under make).
[ "${TC_BUILT:-}" = 1 ] || scripts/build.sh || { echo "test-hier-hosts: FAILED to build"; exit 1; }
prog="$root/target/release/examples/hier_hosts"
source scripts/netns.sh
hostns="tch$$-"
netns_hosts "tcsw$$" "$hostns" 3 10.79.0. || skip "$netns_why"
out="$root/build/hier-hosts"
mkdir -p "$out"
rc=0
export TORCHCOMM_HOST_TRANSPORT="${TORCHCOMM_HOST_TRANSPORT:-gloo}"

# run_layout NAME MIN_DROP "ranks of host 0" "ranks of host 1" ...: rank 0
# must be on host 0 (it hosts the store at 10.79.0.1); MIN_DROP: the least
# factor by which inter-host bytes must drop against the flat path.
run_layout() {
  local name="$1" min_drop="$2"; shift 2
  local size=0 h=0 port=$((29900 + RANDOM % 1000)) pids=()
  for ranks in "$@"; do size=$((size + $(echo "$ranks" | wc -w))); done
  rm -f "$out/$name".*.log
  for ranks in "$@"; do
    ip netns exec "$hostns$h" unshare --uts sh -c '
      hostname "$1"; shift
      h="$1" iface="$2" size="$3" port="$4" prog="$5" log="$6" min_drop="$7" fault="$8"; shift 8
      fail=0; pids=""
      for r in "$@"; do
        env RANK="$r" WORLD_SIZE="$size" MASTER_ADDR=10.79.0.1 MASTER_PORT="$port" \
          TC_HIER_HOST="$h" TC_HIER_IFACE="$iface" GLOO_SOCKET_IFNAME="$iface" UCX_NET_DEVICES="$iface" TC_HIER_MIN_DROP="$min_drop" TC_HIER_FAULT="$fault" \
          TORCHCOMM_DEBUG="${TORCHCOMM_DEBUG:-INFO}" sh -c '"'"'"$0" >"$1" 2>&1; rc=$?; echo "exit status $rc" >>"$1"; exit $rc'"'"' "$prog" "$log.$r.log" &
        pids="$pids $!"
      done
      for p in $pids; do wait "$p" || fail=1; done
      exit $fail' sh "tchost$h" "$h" "$netns_iface" "$size" "$port" "$prog" "$out/$name" "$min_drop" "${TC_HIER_FAULT:-0}" $ranks &
    pids+=($!)
    h=$((h + 1))
  done
  local bad=0
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  echo "--- $name: $# hosts, $size ranks"
  cat "$out/$name.0.log" | grep -v "torchcomm\]" || true
  grep -h "hierarchical collectives\|between hosts" "$out/$name".*.log | sed 's/^[^[]*\[torchcomm\] INFO //' | sort | uniq -c | sed 's/^/    /' || true
  if [ "$bad" != 0 ] || grep -q "CHECK FAIL" "$out/$name".*.log; then
    echo "test-hier-hosts: FAILED ($name); logs in $out:"
    grep -h "CHECK FAIL\|panicked\|error" "$out/$name".*.log | head -20
    rc=1
  fi
}

# One rank per host: no hierarchy (both comms flat), the reference volume.
run_layout one-per-host 0 "0" "1"
run_layout two-by-two 1.4 "0 1" "2 3"
run_layout three-uneven 1.4 "0 3" "1 4" "2"
# The last rank (a member on host 1) exits before an all_reduce: every
# other rank must get an error, none may hang past the timeout.
TC_HIER_FAULT=1 run_layout lost-member 0 "0 1" "2 3"
grep -h "FAULT" "$out"/lost-member.*.log | sed 's/^/    /'
if [ "$rc" = 0 ]; then
  echo "test-hier-hosts: hierarchical collectives over network namespaces (2x1, 2x2, 3 hosts of 2/2/1 ranks, a lost member): all right"
fi
exit $rc
